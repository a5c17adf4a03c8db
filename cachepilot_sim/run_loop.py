"""What the single-GPU `Simulation` (sim.py) and the `ClusterSimulation` (cluster/simulation.py)
share: the event loop that pauses to report progress, the end-of-run check that every request
ended, the trace's meta and the per-request log (request_log.py) for their clients."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.clients import Clients
from cachepilot_sim.components.replay_clients import ReplayClients
from cachepilot_sim.config import SimConfig
from cachepilot_sim.request_log import ExtraColumn, RequestLog
from cachepilot_sim.result import SimulationError
from cachepilot_sim.workloads.replay import ReplayWorkload


def run_events(
    env: SimEnvironment, on_progress: Callable[[int], None] | None, every_events: int
) -> None:
    """`env.run()`; with `on_progress`, its own loop (step until the schedule is empty) paused
    every `every_events` events to call `on_progress(num_events)`."""
    if on_progress is None:
        env.run()
        return
    step, num_events = env.step, 0
    try:
        while True:
            for _ in range(every_events):
                step()
            num_events += every_events
            on_progress(num_events)
    except simpy.core.EmptySchedule:
        return


def check_ended(clients: Clients | ReplayClients, now_us: int, what: str) -> None:
    """SimulationError unless every request sent has completed or been rejected."""
    pending = clients.pending_ids()
    if pending:
        raise SimulationError(
            f"{len(pending)} requests never completed nor were rejected (first ids "
            f"{pending[:5]}); the {what} deadlocked at t={now_us} us"
        )


def trace_meta(
    cfg: SimConfig, clients: Clients | ReplayClients, kv_pool_bytes: int
) -> dict[str, Any]:
    """What a trace reader needs besides the rows (trace/derive.py): classes, SLOs, sizes."""
    names = list(clients.class_names)
    tpot = clients.tpot_slo_us
    return {
        "policy": cfg.policy.name,
        "seed": cfg.seed,
        "class_names": names,
        "ttft_slo_us": list(clients.ttft_slo_us),
        # A replay has one class (the trace) and one TPOT target.
        "tpot_slo_us": [tpot] * len(names) if isinstance(tpot, int) else list(tpot),
        "model_names": [m.name for m in cfg.models],
        "kv_pool_bytes": kv_pool_bytes,
        "session_every": cfg.trace.session_every,
        "iteration_every": cfg.trace.iteration_every,
    }


def request_log(
    clients: Clients | ReplayClients,
    replay: ReplayWorkload | None,
    out_path: Path | None,
    extra: Mapping[str, ExtraColumn] | None = None,
) -> RequestLog:
    """The per-request log of `clients`' requests. Synthetic clients hand it each request as it
    ends; a replay (which holds its whole trace anyway) is logged by `finish_log` at the end, with
    the inferred session in place of the engine's per-request one."""
    sessions = None if replay is None else replay.sessions.session
    log = RequestLog(clients.class_names, clients.ttft_slo_us, out_path, sessions, extra)
    if isinstance(clients, Clients):
        clients.on_end.append(log.end)
        log.streaming = True
    return log


def finish_log(log: RequestLog, clients: Clients | ReplayClients) -> None:
    """Log a replay's requests (it logs nothing while it runs) and close the log."""
    if not log.streaming:
        for r in clients.requests:
            log.add(r)
    log.close()
