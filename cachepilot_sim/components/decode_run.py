"""The batcher's pure-decode runs: k decode steps of an unchanged batch as one timeout.

Split from `batcher.py` to keep the engine loop readable; `DecodeRuns` is the part of the batcher
(one component, one process) that prices a run, waits for its end or a wake-up, and books the
steps it took, on the batcher's packed state.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

if TYPE_CHECKING:
    from cachepilot_sim.clock import SimEnvironment
    from cachepilot_sim.components.engine_stats import EngineStats
    from cachepilot_sim.components.graph_capture import GraphCaptures, GraphKey
    from cachepilot_sim.components.output_lag import OutputLag
    from cachepilot_sim.components.scheduler import RequestQueue
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
    step_start_us: int
    block_new: bool
    queue: RequestQueue  # a cut is worth making only while it holds a request
    _process: simpy.Process | None  # the engine's own process, whose resumption a cut moves
    _run: tuple[int, list[int], simpy.Timeout] | None  # the run in progress: start, ends, timeout
    _cut_steps: int  # steps the run in progress will have taken when it ends
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
        ends = np.cumsum(np.maximum(1.0, np.ceil(raw))).astype(np.int64).tolist()  # step ends
        env = self.env
        start, total = env.now, ends[-1]
        self.lag.next_step(int(ends[0]), n, [])
        # One event per run: the timeout to its end. A notify during the run (an arrival, a
        # landed copy) that can change the batch moves the engine's resumption to the end of
        # the step in progress (`_cut_run`); the engine admits only at step boundaries anyway.
        timer = env.timeout(total)
        self._run = (start, ends, timer)
        self._cut_steps = k
        self.wake.listen(self._cut_run)
        yield timer
        self.wake.listen(None)
        self._run = None
        steps = self._cut_steps
        if steps == k and env.peek() == env.now:
            # Events already due now go first, as they did when the run's end was a timer whose
            # callback triggered the wake event: that event's place in the order, exactly.
            yield env.timeout(0)
        if graphs is not None:
            self._launched(graphs, keys[:steps])
        done = ends[:steps]
        self._account(done[-1], steps)
        self.step_start_us = start + (done[-2] if steps > 1 else 0)
        self._advance_decode(n, done, finished=steps == k)

    def _cut_run(self) -> None:
        """Wake-up during a decode run: end it with the step in progress when a request waits
        to be admitted and admission is open (nothing else changes a running batch between
        steps; `block_new`: the engine admits nothing until a running request finishes, which
        ends the run anyway), by moving the
        engine's resumption from the run's timeout to one at that step's end (what SimPy's own
        `Interruption` does with a process's target). A run whose step in progress is its last
        ends as planned; later notifies of a cut run are dropped."""
        if self._run is None or not len(self.queue) or self.block_new:
            return
        start, ends, timer = self._run
        elapsed = self.env.now - start
        steps = bisect_left(ends, elapsed) + 1  # the step in progress (or just ended) now
        self._run = None
        self.wake.listen(None)
        if steps >= len(ends):
            return
        self._cut_steps = steps
        process = self._process
        assert process is not None and process.target is timer
        timer.callbacks.remove(process._resume)  # type: ignore[union-attr]
        cut = self.env.timeout(ends[steps - 1] - elapsed)
        cut.callbacks.append(process._resume)  # type: ignore[union-attr]
        process._target = cut

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
