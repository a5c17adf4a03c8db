"""Live progress of a run's cells, wherever they run: a hook inside each simulation reports
(cell, requests done, simulated time, events) to a sink, either the RunMonitor itself (cells in
this process) or a queue that a thread of this process drains into it (cells on worker processes).

Reporting pauses SimPy's own stepping loop every `telemetry.progress_every_events` events
(`Simulation.run`); it never changes a result (tests/unit/test_telemetry.py). With a served
Prometheus port, reports also carry the run metrics so far, so every dashboard panel fills while
the run goes on; workers send them through the same queue, so one registry in the main process
serves them all (no prometheus_client multiprocess directory is needed).
"""

from __future__ import annotations

import math
import queue as queue_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachepilot_sim.components.request import Outcome


@dataclass(frozen=True, slots=True)
class CellProgress:
    """One progress report of cell `index` (position in the run's cell order)."""

    index: int
    policy: str
    seed: int
    sim_us: int
    done: int
    total: int
    events: int
    # The run metrics so far (Simulation.metrics on the requests issued until now), numeric only;
    # None when none were asked for or the last snapshot is recent.
    metrics: dict[str, float] | None = None


def numeric_metrics(sim: Any) -> dict[str, float]:
    """`sim.metrics()` mid-run (pure reads of the components), numeric values only."""
    return {
        k: float(v)
        for k, v in sim.metrics().items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def requests_total(sim: Any) -> int:
    """Requests the cell will issue: a replay's trace requests (after `replay.limit`), else the
    synthetic workload's `num_requests` (which a replay does not read)."""
    replay = getattr(sim, "replay", None)
    return int(sim.cfg.workload.num_requests if replay is None else replay.num_requests)


def progress_hook(
    sim: Any,
    index: int,
    send: Callable[[CellProgress], None],
    metrics_every_s: float | None = None,
) -> Any:
    """The `on_progress(num_events)` callback for one Simulation; its `.finish()` reports the
    cell complete. Requests done are counted incrementally (the done prefix is skipped). With
    `metrics_every_s`, a report carries the run metrics so far at most once per that many wall
    seconds (they cost a pass over the issued requests), for the live dashboard."""
    cfg = sim.cfg
    policy, seed, total = cfg.policy.name, cfg.seed, requests_total(sim)
    prefix, events = 0, 0
    last_metrics = -math.inf
    seen: list[Any] = []

    def on_progress(num_events: int) -> None:
        nonlocal prefix, events, last_metrics, seen
        requests = sim.clients.requests
        if requests is not seen:  # replay clients rebuild their list as they send: count afresh
            seen, prefix = requests, 0
        while prefix < len(requests) and requests[prefix].outcome != Outcome.PENDING:
            prefix += 1
        done = prefix + sum(1 for r in requests[prefix:] if r.outcome != Outcome.PENDING)
        events = num_events
        metrics = None
        now = time.perf_counter()
        if metrics_every_s is not None and now - last_metrics >= metrics_every_s:
            metrics, last_metrics = numeric_metrics(sim), now
        send(CellProgress(index, policy, seed, sim.env.now, done, total, num_events, metrics))

    def finish() -> None:
        send(CellProgress(index, policy, seed, sim.env.now, total, total, events))

    on_progress.finish = finish  # type: ignore[attr-defined]
    return on_progress


class ProgressRelay:
    """A queue that worker processes put CellProgress on (a multiprocessing Manager queue, which
    pickles into `ProcessPoolExecutor.submit`) and a thread that hands each report to `receive`."""

    def __init__(self, context: Any, receive: Callable[[CellProgress], None]) -> None:
        self._manager = context.Manager()
        self.queue = self._manager.Queue()
        self._receive = receive
        self._thread = threading.Thread(target=self._drain, name="progress-relay", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=0.5)
            except queue_module.Empty:
                continue
            except (EOFError, OSError):  # the manager went away
                return
            if item is None:
                return
            self._receive(item)

    def close(self) -> None:
        """Deliver what is queued, then stop the thread and the manager process."""
        self.queue.put(None)
        self._thread.join(timeout=10)
        self._manager.shutdown()
