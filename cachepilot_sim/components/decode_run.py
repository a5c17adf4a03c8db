"""The batcher's pure-decode runs: k decode steps of an unchanged batch as one timeout.

Split from `batcher.py` to keep the engine loop readable; `DecodeRuns` is the part of the batcher
(one component, one process) that prices a run, waits for its end or a wake-up, and books the
steps it took, on the batcher's packed state.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

if TYPE_CHECKING:
    from cachepilot_sim.clock import SimEnvironment
    from cachepilot_sim.components.engine_stats import EngineStats
    from cachepilot_sim.components.graph_capture import GraphCaptures, GraphKey
    from cachepilot_sim.components.output_lag import OutputLag
    from cachepilot_sim.components.signal import Signal
    from cachepilot_sim.components.step_cost import StepCostModel


class DecodeRuns:
    """Decode runs: one timeout for up to `max_decode_run` steps, cut short by a wake-up."""

    n: int
    ctx: np.ndarray
    decode_left: np.ndarray
    generated: np.ndarray
    tok_bytes: np.ndarray
    model: np.ndarray
    ghost: np.ndarray
    env: SimEnvironment
    wake: Signal
    step_cost: StepCostModel
    stats: EngineStats
    max_decode_run: int
    fast_decode_runs: bool
    step_start_us: int
    _run_id: int
    lag: OutputLag

    graphs: GraphCaptures | None
    stall_us: int

    if TYPE_CHECKING:  # provided by DecodeGrowth and the batcher; declared for the type checker

        def _reserve_decode_blocks(self, k: int) -> int: ...

        def _raw_duration_us(
            self, decode: list[int], chunk_idx: list[int], chunks: list[int]
        ) -> float: ...

        def _account(self, duration: int, steps: int) -> None: ...

        def _finish_done(self) -> None: ...

        def _take_stall(self) -> int: ...

        def _run_graph_keys(self, graphs: GraphCaptures, num_steps: int) -> list[GraphKey]: ...

        def _launched(self, graphs: GraphCaptures, keys: list[GraphKey]) -> int: ...

    def _decode_run(self) -> Generator[simpy.Event, object, None]:
        """Up to k pure-decode steps as one timeout; blocks for all k steps are reserved first.

        Step j lasts ceil(first + j * slope) us, exactly what k single iterations would take,
        because iteration time is linear in context length (cost.decode_step_slope_us).
        """
        k = min(min(self.decode_left[: self.n].tolist()), self.max_decode_run)
        k = self._reserve_decode_blocks(k)
        if k == 0:
            return
        n = self.n
        raw = self.step_cost.decode_run_us(self.ctx[:n], self.tok_bytes[:n], self.model[:n], k)
        if self.ghost.size:  # last step's finished requests ride along in this one
            raw[0] = self._raw_duration_us(list(range(n)), [], [])
        graphs, keys = self.graphs, []
        if graphs is not None:  # lazy captures: priced now, booked for the steps that run
            keys = self._run_graph_keys(graphs, k)
            raw = raw + np.asarray(graphs.stalls(keys), dtype=np.float64)
        if self.ghost.size:
            self.ghost = self.ghost[:, :0]
        if self.stall_us:  # copies enqueued before the run delay its first step
            raw[0] += self._take_stall()
        ends = np.cumsum(np.maximum(1.0, np.ceil(raw))).astype(np.int64)  # step j's end, in us
        env = self.env
        start, total = env.now, int(ends[-1])
        self.lag.next_step(int(ends[0]), n, [])
        if env.peek() > start + total and self.fast_decode_runs:
            # Nothing is scheduled before the run ends, so nothing can cut it short (every event
            # that could wake the engine follows from one already scheduled): one plain timeout
            # resumes the engine at the same point of the event order as the timer-and-wake pair.
            yield env.timeout(total)
            steps = k
        else:
            # The run's end and any wake-up (arrival, landed copy) both trigger the wake event;
            # a stale timer from an interrupted run finds its run id changed and does nothing.
            self._run_id += 1
            run_id = self._run_id
            timer = env.timeout(total)
            timer.callbacks.append(lambda _: self._end_run(run_id))
            yield self.wake.wait()
            steps = k
            elapsed = env.now - start
            if elapsed < total:
                steps = int(ends.searchsorted(elapsed)) + 1  # the step in progress at the wake
                if ends[steps - 1] > elapsed:
                    yield env.timeout(int(ends[steps - 1]) - elapsed)
        if graphs is not None:
            self._launched(graphs, keys[:steps])
        done = ends[:steps].tolist()
        self._account(done[-1], steps)
        self.step_start_us = start + (done[-2] if steps > 1 else 0)
        self._advance_decode(n, done, finished=steps == k)

    def _end_run(self, run_id: int) -> None:
        """Timer callback of a decode run: wake the engine unless that run was already cut short."""
        if run_id == self._run_id:
            self.wake.notify()

    def _advance_decode(self, n: int, ends: list[int], finished: bool) -> None:
        """Decode steps of all n sequences, step j ending `ends[j]` us into the run; only a full
        run (k = the fewest tokens left, or the run cap) can finish a sequence."""
        steps = self.stats.add_run(ends, n)
        self.ctx[:n] += steps
        self.decode_left[:n] -= steps
        self.generated[:n] += steps
        self.stats.tokens_decoded += steps * n
        if finished:
            self._finish_done()
