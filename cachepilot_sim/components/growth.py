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
    num_preempted: int  # preemptions so far (the batcher skips admission after one, vLLM)
    grow_before_admit: bool
    admit_after_preemption: bool

    def _remove(self, i: int) -> Request:  # provided by the batcher
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by EngineStalls; declared for the type checker

        def _swap_out(self, victim: int) -> bool: ...

    def _reserve_decode_blocks(self, k: int) -> int:
        """Reserve blocks for k decode steps, shortening the run when memory is short; the
        single-step fallback evicts and, failing that, preempts. Returns the steps to run."""
        n, bt, ahead = self.n, self.block_tokens, self.grow_ahead
        ctx, blocks = self.ctx[:n].tolist(), self.blocks[:n].tolist()
        # Plain ints: the batch is small, and a list pass is cheaper than NumPy calls on it.
        # room: steps every sequence can take before one needs a block it lacks.
        room = min([b * bt - c for b, c in zip(blocks, ctx, strict=True)]) - ahead
        if room >= k:
            return k
        if self.reserve_run_blocks:
            need = [max(0, -(-(c + k + ahead) // bt) - b) for c, b in zip(ctx, blocks, strict=True)]
            size = self.block_bytes[:n].tolist()
            if sum([x * y for x, y in zip(need, size, strict=True)]) <= self.pool.free_bytes:
                idx = [i for i, x in enumerate(need) if x]
                grown = self._grow(idx, [need[i] for i in idx])
                assert grown
                return k
        # Memory is short, or blocks are taken as the steps cross into them: stop at the first
        # block boundary; at one, a single step that evicts and, failing that, preempts.
        if room >= 1:
            return min(k, room)
        return 1 if self._grow_decode() else 0

    def _grow_before_admit(self) -> bool:
        """At a step boundary, running sequences needing a block take it before queued requests
        are considered (engine.grow_before_admit). False: that preempted one, and the engine
        then admits nothing this step (engine.admit_after_preemption=false: vLLM v1 schedules
        its waiting queue only `if not preempted_reqs`)."""
        preempted = self.num_preempted
        if self.grow_before_admit and self.n and self._at_block_boundary():
            self._grow_decode()
        return self.admit_after_preemption or self.num_preempted == preempted

    def _at_block_boundary(self) -> bool:
        """Some decoding sequence needs a block before its next token (`_needing` is not empty)."""
        n, bt, ahead = self.n, self.block_tokens, self.grow_ahead
        pl, ctx = self.prefill_left[:n].tolist(), self.ctx[:n].tolist()
        blocks = self.blocks[:n].tolist()
        return any(p == 0 and c + ahead >= b * bt for p, c, b in zip(pl, ctx, blocks, strict=True))

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
            idx = self._needing().tolist()
            if not idx or self._grow(idx, [1] * len(idx)):
                return True
            self._preempt_one()
        return False

    def _grow_starved(self) -> bool:
        """transformers CB: sequences take their block one by one in admission order; those left
        without one (starved) are preempted newest first until the others get theirs, never the
        last running sequence. Simplification: the surviving starved sequences get their block
        at once, where the engine lets them sit out this one step. False: nothing is running."""
        starved = [i for i in self._needing().tolist() if not self._grow([i], [1])]
        while starved and self.n > 1:
            reqs = [self.slot_req[i] for i in starved]
            self._preempt_column(starved[-1], front=False)
            self.block_new = True
            cols = {id(r): i for i, r in enumerate(self.slot_req[: self.n])}
            left = sorted((cols[id(r)] for r in reqs[:-1]), key=lambda i: int(self.order[i]))
            starved = [i for i in left if not self._grow([i], [1])]
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

    def _grow(self, idx: list[int], num_blocks: list[int]) -> bool:
        """Ask the KV manager for `num_blocks[j]` more blocks for column `idx[j]`; all or
        nothing.
        """
        slot_req = self.slot_req
        sessions = [slot_req[i].session_id for i in idx]  # type: ignore[union-attr]
        if not self.kv.grow(sessions, num_blocks):
            return False
        blocks = self.blocks
        for i, b in zip(idx, num_blocks, strict=True):
            blocks[i] += b
        return True

    def _preempt_one(self) -> None:
        """Recompute-preempt the lowest-priority, most recently admitted running sequence."""
        n = self.n
        self._preempt_column(int(np.lexsort((-self.order[:n], self.prio[:n]))[0]), front=True)

    def _preempt_column(self, victim: int, front: bool) -> None:
        """Preempt column `victim`: its KV goes to the engine's CPU swap space when that has
        room (one victim at a time, as chosen: transformers gives the space to a round's oldest
        victim first, which differs only when one round has several), else it is dropped and
        recomputed on resume (soft reset)."""
        tokens = int(self.ctx[victim])
        self.num_preempted += 1
        swapped = self._swap_out(victim)
        self.stats.preempted(self.slot_req[victim], self.env.now, self.prefill_left[victim] == 0)
        req = self._remove(victim)
        self.kv.preempt(req, tokens, swapped)
        if front:
            self.queue.requeue_front(req)
        else:
            self.queue.requeue_back(req)
