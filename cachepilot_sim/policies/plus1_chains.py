"""perc_plus1's chained decision over prefix blocks of one size, as an index of the chain tails.

On chains `PercPlusOnePolicy.select_victims` (`_plus_one_on_chains`) runs greedy by PERC's ratio
(cost / size, ties by position in the candidate forest) over the current tails, and prices the
cheapest k-block suffix of a leaf chain (a chain nothing sits below) that covers the need alone;
the suffix wins only when strictly cheaper. With one-block chains and no branch chains it runs
`greedy_plus_one` instead. This index keeps a restore regime's tails in a `PercIndex` by ratio,
their ids being *positions*: a stamp taken when a block becomes a tail, which is the order in
which `PrefixTree.forest()` lists the leaf chains (`components/kv/plus1_tails.py` does the rest).
Costs are computed as `expected_costs` computes them (the same float operations; `math.expm1`
equals NumPy's on these arguments, which `tests/property/test_plus1_index.py` checks), ratios
as `greedy_by_ratio` divides them.
"""

from __future__ import annotations

import math

from cachepilot_sim.policies.base import CacheEntry
from cachepilot_sim.policies.perc_index import PercIndex
from cachepilot_sim.policies.reuse import GapEstimator


class PlusOneChainIndex:
    """Chain tails of one restore regime by (PERC's ratio now, position)."""

    __slots__ = ("estimator", "index", "num_keyed")

    def __init__(self, estimator: GapEstimator) -> None:
        self.estimator = estimator
        self.index = PercIndex(estimator.delta_us)
        self.num_keyed = 0  # exact costs computed by decisions (a complexity probe)

    def __len__(self) -> int:
        return len(self.index)

    def add(self, stamp: int, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index a tail at its position `stamp` (replacing an item of that stamp)."""
        size = float(max(entry.num_bytes, 1))
        self.index.add(stamp, entry.last_used_us, gap_ema_us, restore_us, size)

    def discard(self, stamp: int) -> None:
        """The tail at `stamp` is no longer indexed (no-op when absent)."""
        self.index.discard(stamp)

    def advance(self, now_us: int) -> None:
        """Set the clock before loading many tails at once (`PercIndex.advance`)."""
        self.index.advance(now_us)

    def pop_min(self, now_us: int) -> int | None:
        """The stamp of the smallest (ratio, stamp) now, removed; None when empty."""
        return self.index.pop_min(now_us, self.estimator.population_gap_us)

    def cost(self, entry: CacheEntry, restore_us: float, gap_ema_us: float, now_us: int) -> float:
        """`expected_costs`' value for the entry now: P(resume within δ) x restore (µs)."""
        self.num_keyed += 1
        est = self.estimator
        base = gap_ema_us if gap_ema_us >= 0 else est.population_gap_us
        g = max(max(base, float(now_us - entry.last_used_us)), 1.0)
        return -math.expm1(-est.delta_us / g) * restore_us


def ratio_of(cost: float, entry: CacheEntry) -> float:
    """`greedy_by_ratio`'s ratio: the cost over the size in bytes."""
    return cost / max(entry.num_bytes, 1)
