"""PERC: evict the KV whose expected restore cost per byte over the next delta is lowest.

score = P(resume within delta) x restore_cost / bytes, P = 1 - exp(-lambda delta), lambda learned
per session (policies/reuse.py). Greedy by this ratio is optimal only for the fractional relaxation
of the choose-victims knapsack, not for whole-session (0/1) eviction; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.perc_index import PercIndex
from cachepilot_sim.policies.reuse import GapEstimator

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

    def time_index(self) -> PercEntryIndex:
        """An exact index of this key (`policies/perc_index.py`): a decision keys the records of
        the idle entries' weights, not every entry, once the restore estimate is fixed."""
        return PercEntryIndex(self.estimator)


class PercEntryIndex:
    """`PercIndex` over cache entries: weight restore_us / bytes, base the entry's gap EMA (the
    population's when it has none, read at each decision)."""

    __slots__ = ("estimator", "index")

    def __init__(self, estimator: GapEstimator) -> None:
        self.estimator = estimator
        self.index = PercIndex(estimator.delta_us)

    def __len__(self) -> int:
        return len(self.index)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate (`restore_us`) and gap EMA (< 0: none)
        stay as given while it is idle (the manager re-adds it when they change)."""
        size = float(max(entry.num_bytes, 1))
        self.index.add(entry.entry_id, entry.last_used_us, gap_ema_us, restore_us, size)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate."""
        self.index.discard(entry_id)

    def pop_min(self, now_us: int) -> int | None:
        """The id of the entry `PercPolicy.order` would put first now, removed from the index."""
        return self.index.pop_min(now_us, self.estimator.population_gap_us)

    def num_keyed(self) -> int:
        """Entries keyed by decisions so far (a complexity probe)."""
        return self.index.num_keyed
