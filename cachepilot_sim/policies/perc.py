"""PERC: evict the KV whose expected restore cost per byte over the next delta is lowest.

score = P(resume within delta) x restore_cost / bytes, P = 1 - exp(-lambda delta), lambda learned
per session (policies/reuse.py). Greedy by this ratio is optimal only for the fractional relaxation
of the choose-victims knapsack, not for whole-session (0/1) eviction; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register

# Below this many candidates a Python sort beats building NumPy arrays.
_VECTORISE_FROM = 32


@register("perc")
class PercPolicy(RankingPolicy):
    name = "perc"
    key_scope = KeyScope.DECISION  # P(resume within delta) decays with idle time

    def score(self, entry: CacheEntry, now_us: int) -> float:
        p = self.estimator.resume_probability(entry, now_us)
        return p * entry.restore_us / max(entry.num_bytes, 1)

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (self.score(entry, now_us), entry.entry_id)

    def order(self, entries: Sequence[CacheEntry], now_us: int) -> list[CacheEntry]:
        if len(entries) < _VECTORISE_FROM:
            return super().order(entries, now_us)
        n = len(entries)
        gap = np.fromiter((e.gap_ema_us for e in entries), dtype=np.float64, count=n)
        idle = np.fromiter((now_us - e.last_used_us for e in entries), dtype=np.float64, count=n)
        restore = np.fromiter((e.restore_us for e in entries), dtype=np.float64, count=n)
        size = np.fromiter((max(e.num_bytes, 1) for e in entries), dtype=np.float64, count=n)
        ids = np.fromiter((e.entry_id for e in entries), dtype=np.int64, count=n)
        score = self.estimator.resume_probabilities(gap, idle) * restore / size
        order = np.lexsort((ids, score))
        return [entries[i] for i in order]
