"""The batcher's decode-time memory: more KV blocks for growing sequences, and preemption when
there are none (`engine.preemption` picks the engine's rule).

Split from `batcher.py` to keep the engine loop readable; `DecodeGrowth` is the part of the
batcher (one component, one process) that owns these decisions, and works on its packed state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cachepilot_sim.config import Preemption

if TYPE_CHECKING:
    from cachepilot_sim.clock import SimEnvironment
    from cachepilot_sim.components.engine_stats import EngineStats
    from cachepilot_sim.components.kv import KvManager
    from cachepilot_sim.components.request import Request
    from cachepilot_sim.components.scheduler import RequestQueue
    from cachepilot_sim.components.vram_pool import PoolView
    from cachepilot_sim.trace.events import TraceEvents

_ONE = np.ones(1, dtype=np.int64)


class DecodeGrowth:
    """Block growth of decoding sequences and the preemption rule of the imitated engine."""

    n: int
    ctx: np.ndarray
    blocks: np.ndarray
    block_bytes: np.ndarray
    block_tokens: int
    prefill_left: np.ndarray
    order: np.ndarray
    prio: np.ndarray
    slot_req: list[Request | None]
    kv: KvManager
    pool: PoolView
    queue: RequestQueue
    preemption: Preemption
    env: SimEnvironment
    stats: EngineStats
    events: TraceEvents
    block_new: bool
    reserve_run_blocks: bool
    grow_ahead: int  # 1: a step's block is taken when the step before it starts (async)

    def _remove(self, i: int) -> Request:  # provided by the batcher
        raise NotImplementedError

    def _reserve_decode_blocks(self, k: int) -> int:
        """Reserve blocks for k decode steps, shortening the run when memory is short; the
        single-step fallback evicts and, failing that, preempts. Returns the steps to run."""
        n = self.n
        ctx, blocks = self.ctx[:n], self.blocks[:n]
        need = np.maximum(0, -(-(ctx + k + self.grow_ahead) // self.block_tokens) - blocks)
        if not need.any():
            return k
        if not self.reserve_run_blocks:  # blocks as the steps cross into them
            room = int((blocks * self.block_tokens - ctx).min()) - self.grow_ahead
            return min(k, room) if room >= 1 else (1 if self._grow_decode() else 0)
        num_bytes = int(np.dot(need, self.block_bytes[:n]))
        if num_bytes <= self.pool.free_bytes:
            idx = np.flatnonzero(need)
            grown = self._grow(idx, need[idx])
            assert grown
            return k
        room = int((blocks * self.block_tokens - ctx).min()) - self.grow_ahead
        if room >= 1:
            return min(k, room)
        return 1 if self._grow_decode() else 0

    def _needing(self) -> np.ndarray:
        """Columns of decoding sequences at a block boundary, in admission order."""
        n = self.n
        full = self.ctx[:n] + self.grow_ahead >= self.blocks[:n] * self.block_tokens
        need = np.flatnonzero((self.prefill_left[:n] == 0) & full)
        if need.size <= 1:
            return need
        return need[np.argsort(self.order[need], kind="stable")]

    def _grow_decode(self) -> bool:
        """Give each decoding sequence at a block boundary one more block, preempting running
        sequences while memory is short; False when nothing is left running."""
        if self.preemption == Preemption.STARVED_BACK and not self._grow_starved():
            return False
        while self.n:
            idx = self._needing()
            if idx.size == 0 or self._grow(idx, np.ones(idx.size, dtype=np.int64)):
                return True
            self._preempt_one()
        return False

    def _grow_starved(self) -> bool:
        """transformers CB: sequences take their block one by one in admission order; those left
        without one (starved) are preempted newest first until the others get theirs, never the
        last running sequence. Simplification: the surviving starved sequences get their block
        at once, where the engine lets them sit out this one step. False: nothing is running."""
        starved = [int(i) for i in self._needing() if not self._grow(np.array([i]), _ONE)]
        while starved and self.n > 1:
            reqs = [self.slot_req[i] for i in starved]
            self._preempt_column(starved[-1], front=False)
            self.block_new = True
            cols = {id(r): i for i, r in enumerate(self.slot_req[: self.n])}
            left = sorted((cols[id(r)] for r in reqs[:-1]), key=lambda i: int(self.order[i]))
            starved = [i for i in left if not self._grow(np.array([i]), _ONE)]
        return self.n > 0

    def _starve_queued(self, req: Request) -> None:
        """transformers CB makes a queued request active when its prompt hits cached blocks, and
        only then allocates the rest; left without blocks it is a starved running request and is
        evicted like one (never the last running one): a soft reset to the back of the queue,
        and no admission until a request finishes."""
        if not self.n:
            return
        self.queue.pop(req)
        req.num_preemptions += 1
        self.kv.stats.preemptions += 1
        self.events.preempt(int(self.env.now), req, 0, 0, 0.0)
        self.queue.requeue_back(req)
        self.block_new = True

    def _grow(self, idx: np.ndarray, num_blocks: np.ndarray) -> bool:
        """Ask the KV manager for `num_blocks[j]` more blocks for column `idx[j]`; all or
        nothing.
        """
        sessions = [self.slot_req[i].session_id for i in idx.tolist()]  # type: ignore[union-attr]
        if not self.kv.grow(sessions, num_blocks.tolist()):
            return False
        self.blocks[idx] += num_blocks
        return True

    def _preempt_one(self) -> None:
        """Recompute-preempt the lowest-priority, most recently admitted running sequence."""
        n = self.n
        self._preempt_column(int(np.lexsort((-self.order[:n], self.prio[:n]))[0]), front=True)

    def _preempt_column(self, victim: int, front: bool) -> None:
        tokens = int(self.ctx[victim])
        self.stats.preempted(self.slot_req[victim], self.env.now, self.prefill_left[victim] == 0)
        req = self._remove(victim)
        self.kv.preempt(req, tokens)
        if front:
            self.queue.requeue_front(req)
        else:
            self.queue.requeue_back(req)
