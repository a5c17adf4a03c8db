"""Live progress of a run's cells, wherever they run: a hook inside each simulation reports
(cell, requests done, simulated time, events) to a sink, either the RunMonitor itself (cells in
this process) or a queue that a thread of this process drains into it (cells on worker processes).

Reporting pauses SimPy's own stepping loop every `telemetry.progress_every_events` events
(`Simulation.run`); it never changes a result (tests/unit/test_telemetry.py). The dashboard's
metrics come from the live publisher in simulated time (experiment/live.py), not from here.
"""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


def requests_total(sim: Any) -> int:
    """Requests the cell will issue: a replay's trace requests (after `replay.limit`), else the
    synthetic workload's `num_requests` (which a replay does not read)."""
    replay = getattr(sim, "replay", None)
    return int(sim.cfg.workload.num_requests if replay is None else replay.num_requests)


def progress_hook(sim: Any, index: int, send: Callable[[CellProgress], None]) -> Any:
    """The `on_progress(num_events)` callback for one Simulation; its `.finish()` reports the
    cell complete. Requests done are the clients' count of requests ended."""
    cfg, clients = sim.cfg, sim.clients
    policy, seed, total = cfg.policy.name, cfg.seed, requests_total(sim)
    events = 0

    def on_progress(num_events: int) -> None:
        nonlocal events
        events = num_events
        done = clients.num_ended
        send(CellProgress(index, policy, seed, sim.env.now, done, total, num_events))

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
