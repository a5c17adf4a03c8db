"""The batcher's per-step KV read cap and chunked-prefill plan.

transformers 5.17 continuous batching (`ContinuousBatchingManager._generation_step`,
`Scheduler._process_candidates`) schedules a step with `cache_budget = cache.num_pages`, the pool
in tokens: each candidate, in order (decoding requests, then prefilling ones, then the waiting
queue), needs its cached past (`state.current_len()`, the tokens already in the cache, read
through one fixed-size index tensor) out of what is left; one that does not fit is passed over
for that step (`continue`), and the loop stops once nothing is left. A shared prefix is read once
per request that holds it, so under prefix sharing the reads exceed the KV in use and the cap
binds in a pool that holds every block: a request whose prefix hit activated it (it holds the hit
blocks) can wait behind decoding requests for hundreds of milliseconds, and decoding requests can
sit out steps. `engine.kv_read_cap` turns the rule on (the transformers profiles); off, a step
reads any amount.

`ReadBudget` is the part of the batcher (one component, one process) that applies the cap to a
step's candidates and plans the prefill chunks of the ones that may run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cachepilot_sim.components.request import Request

if TYPE_CHECKING:
    from cachepilot_sim.clock import SimEnvironment
    from cachepilot_sim.components.engine_stats import EngineStats

NONE_HELD = 1 << 62  # `held_from` when no column sits out the step


def fit_reads(reads: list[int], budget: int) -> list[bool]:
    """Which candidates (in the engine's order, each reading `reads[j]` cached tokens) a step
    with `budget` tokens to read schedules: one that needs more than is left is passed over, and
    the loop ends once nothing is left (`cache_budget <= 0`)."""
    left, out = budget, []
    for r in reads:
        if left <= 0:
            out.append(False)
            continue
        fits = r <= left
        out.append(fits)
        if fits:
            left -= r
    return out


class ReadBudget:
    """The per-step KV read cap (`read_budget` tokens; 0: none) and the prefill plan."""

    n: int
    ctx: np.ndarray
    prefill_left: np.ndarray
    order: np.ndarray
    ghost: np.ndarray
    held_from: int
    read_budget: int
    max_decode_run: int
    slot_req: list[Request | None]
    env: SimEnvironment
    stats: EngineStats
    _passed_over: dict[int, int]  # request id -> when its last token came, while passed over

    def _reads_bind(self) -> bool:
        """The cap could pass over a decoding sequence within a decode run: run single steps."""
        if not self.read_budget:
            return False
        n = self.n
        reads = sum(self.ctx[:n].tolist()) + sum(self.ghost[0].tolist())
        return reads + n * self.max_decode_run > self.read_budget

    def _capped(self, decode: list[int]) -> tuple[list[int], set[int] | None]:
        """The decoding columns a step schedules under the cap and the prefilling columns that
        may take a chunk (None: every one), in admission order after the decoding ones; the
        finished requests that ride along (async scheduling) read first."""
        if not self.read_budget:
            return decode, None
        n, ctx, order = self.n, self.ctx, self.order
        budget = self.read_budget - sum(self.ghost[0].tolist())
        dec = sorted(decode, key=lambda i: int(order[i]))
        pre = sorted((i for i in range(n) if self.prefill_left[i] > 0), key=lambda i: int(order[i]))
        fits = fit_reads([int(ctx[i]) for i in dec + pre], budget)
        if fits and not any(fits):  # the rides-along took it all: the first still runs
            fits[0] = True
        kept = [i for i, f in zip(dec, fits, strict=False) if f]
        allowed = {i for i, f in zip(pre, fits[len(dec) :], strict=True) if f}
        for i, f in zip(dec, fits, strict=False):
            req = self.slot_req[i]
            if not f and req is not None:  # its next token's gap runs from its last one (now)
                self._passed_over.setdefault(req.req_id, self.env.now)
        return sorted(kept), allowed

    def _passed_over_gaps(self, decoded: np.ndarray, now: int) -> int:
        """Book the token gaps of the columns where `decoded` that sat out earlier steps (from
        their last token to `now`); returns how many there were (the rest waited one step)."""
        if not self._passed_over:
            return 0
        done = 0
        for i in decoded.nonzero()[0].tolist():
            req = self.slot_req[i]
            if req is not None and (last := self._passed_over.pop(req.req_id, None)) is not None:
                self.stats.add_gaps(now - last, 1)
                done += 1
        return done

    def _plan_prefill(
        self, tokens_left: int, allowed: set[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """Chunked prefill: sequences in admission order share what is left of the token budget
        (only those in `allowed` when the read cap passed some over); the columns that get a
        chunk, and their chunks."""
        n = self.n
        left = self.prefill_left[:n]  # never negative: nonzero is > 0
        if self.held_from == NONE_HELD:
            idx = left.nonzero()[0]
        else:
            idx = ((left > 0) & (self.order[:n] < self.held_from)).nonzero()[0]
        if allowed is not None:
            idx = idx[[int(i) in allowed for i in idx]]
        if idx.size == 0 or tokens_left <= 0:
            return [], []
        if idx.size == 1:  # the common case: one prompt in prefill
            i = int(idx[0])
            return [i], [min(int(left[i]), tokens_left)]
        idx = idx[np.argsort(self.order[idx], kind="stable")]
        want = self.prefill_left[idx]
        before = np.cumsum(want) - want
        chunks = np.minimum(np.maximum(tokens_left - before, 0), want)
        keep = chunks > 0
        return idx[keep].tolist(), chunks[keep].tolist()
