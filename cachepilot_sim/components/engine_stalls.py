"""The batcher's compute-stream stalls: lazy CUDA-graph captures (`graph_capture.py`) and the CPU
swap copies of preempted requests (`cpu_swap.py`), both added to the step they delay.

Split from `batcher.py` like `growth.py` and `decode_run.py`: `EngineStalls` is the part of the
batcher (one component, one process) that keys a step's graph, decides swap or soft reset for a
victim, brings a swapped request back and orders the queue the way the engine does then. With the
defaults (no lazy graphs, no swap space) none of it runs and no step changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cachepilot_sim.components.graph_capture import GraphCaptures, GraphKey, graph_key

if TYPE_CHECKING:
    from cachepilot_sim.clock import SimEnvironment
    from cachepilot_sim.components.cpu_swap import CpuSwapSpace
    from cachepilot_sim.components.engine_stats import EngineStats
    from cachepilot_sim.components.request import Request
    from cachepilot_sim.trace.events import TraceEvents


class EngineStalls:
    """Graph-capture and swap-copy stalls of the imitated engine, on the batcher's state."""

    n: int
    ctx: np.ndarray
    blocks: np.ndarray
    block_bytes: np.ndarray
    ghost: np.ndarray
    slot_req: list[Request | None]
    env: SimEnvironment
    stats: EngineStats
    events: TraceEvents
    graphs: GraphCaptures | None  # None: no lazy captures (graph_mode NONE or PRECAPTURED)
    swap: CpuSwapSpace | None  # None: preemption recomputes (no CPU swap space)
    stall_us: int  # copies enqueued since the last step: the next step waits for them

    def _take_stall(self) -> int:
        """The pending copy stall (µs), now charged to the step about to run."""
        us, self.stall_us = self.stall_us, 0
        return us

    # -- lazy graph captures -------------------------------------------------------------------
    def _step_graph_stall(
        self, graphs: GraphCaptures, decode: list[int], chunk_idx: list[int], chunks: list[int]
    ) -> int:
        """Launch the mixed step about to run (one token for each column in `decode`, chunk
        `chunks[j]` for column `chunk_idx[j]`, and last step's finished requests, the ghosts):
        its capture stall (µs), 0 when its graph exists."""
        ctx = self.ctx[: self.n].tolist()
        ghost = self.ghost[0].tolist()
        seqlen = [ctx[i] + 1 for i in decode] + [c + 1 for c in ghost]
        seqlen += [ctx[i] + c for i, c in zip(chunk_idx, chunks, strict=True)]
        if not seqlen:  # nothing launches
            return 0
        key = graph_key(
            graphs.padding,
            len(decode) + len(ghost) + sum(chunks),
            sum([ctx[i] for i in decode + chunk_idx]) + sum(ghost),
            max(seqlen),
        )
        return self._launched(graphs, [key])

    def _run_graph_keys(self, graphs: GraphCaptures, num_steps: int) -> list[GraphKey]:
        """Keys of a pure-decode run's steps: every sequence reads one more token each step; the
        ghosts ride along in the first."""
        n = self.n
        ctx = self.ctx[:n].tolist()
        kv, top, pad = sum(ctx), max(ctx) + 1, graphs.padding
        keys = [graph_key(pad, n, kv + j * n, top + j) for j in range(num_steps)]
        ghost = self.ghost[0].tolist()
        if ghost:
            keys[0] = graph_key(pad, n + len(ghost), kv + sum(ghost), max(top, max(ghost) + 1))
        return keys

    def _launched(self, graphs: GraphCaptures, keys: list[GraphKey]) -> int:
        """Book steps that ran with `keys`; their total capture stall (µs)."""
        before = graphs.num_captures
        us = graphs.launch(keys)
        self.stats.graph_captures += graphs.num_captures - before
        self.stats.graph_capture_us += us
        return us

    # -- CPU swap ------------------------------------------------------------------------------
    def _release_swap(self, req: Request) -> None:
        """`req` ended while swapped out (rejected): its CPU swap blocks are free again."""
        if self.swap is not None:
            self.swap.release(req.req_id)

    def _swap_out(self, victim: int) -> bool:
        """Copy the victim column's blocks to the swap space if they fit (the engine's rule);
        False: it is soft reset. The copy delays the next step."""
        swap, req = self.swap, self.slot_req[victim]
        if swap is None or req is None:
            return False
        num_blocks = int(self.blocks[victim])
        num_bytes = num_blocks * int(self.block_bytes[victim])
        us = swap.swap_out(req.req_id, num_blocks, num_bytes, int(self.ctx[victim]))
        if us is None:
            return False
        req.num_cpu_swaps += 1
        self.stats.cpu_swaps += 1
        self.stats.swap_copy_us += us
        self.stall_us += us
        self.events.swap_out(int(self.env.now), req, num_blocks, num_bytes, us)
        return True

    def _swapped_out(self, req: Request) -> bool:
        return self.swap is not None and self.swap.holds(req.req_id)

    def _swap_in(self, req: Request) -> None:
        """`req` got its GPU blocks back: copy its KV in (delaying the next step); it processes
        only the tokens it had not cached (a decoding request: its last token, which it had
        generated but not yet fed back)."""
        assert self.swap is not None
        num_blocks, num_bytes, cached, us = self.swap.swap_in(req.req_id)
        done = req.context_tokens + req.prompt_tokens + req.generated
        req.prefill_tokens = max(1, done - cached)
        self.stats.swap_copy_us += us
        self.stall_us += us
        self.events.swap_in(int(self.env.now), req, num_blocks, num_bytes, us)

    def _interleave_swapped(self, order: list[Request]) -> list[Request]:
        """transformers' `_get_waiting_candidates`: swapped-out requests and the others take
        turns, a swapped one first, each kind in queue order."""
        swap = self.swap
        if swap is None:
            return order
        swapped = [r for r in order if swap.holds(r.req_id)]
        if not swapped:
            return order
        fresh = [r for r in order if not swap.holds(r.req_id)]
        out: list[Request] = []
        for i in range(max(len(swapped), len(fresh))):
            out += swapped[i : i + 1] + fresh[i : i + 1]
        return out
