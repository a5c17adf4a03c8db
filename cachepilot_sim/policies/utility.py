"""Utility baselines from recent KV-cache papers, written from their stated rules.

`marconi`: in the spirit of Marconi (Pan et al., MLSys'25): utility = recency + flop_weight x FLOP
efficiency, both min-max normalised over the candidates; FLOP efficiency is the recompute work
saved per byte kept (recompute_us / bytes stands in for FLOPs / bytes: prefill time is linear in
FLOPs in our cost model). Lowest utility is evicted first.
`wild`: in the spirit of "KVCache Cache in the Wild" (Wang et al., ATC'25): per workload class, the
reuse probability follows an exponential model of reuse time; evict the lowest predicted
probability of reuse within delta, LRU among equals. It does not weigh restore cost or size.
`tlru`: in the spirit of Tail-Optimized LRU (Zhang et al., 2025): KV whose loss cannot push the
next turn's TTFT past the tail target does not matter for the tail, so it goes first (LRU), then
the rest (LRU). With whole-session entries "tail-first" is this two-class order. On prefix chains
a block's loss costs the restore of the whole suffix cut with it, so the blocks that do not matter
are each chain's excess tail: those whose suffix restore stays within the target. The prefix
manager keeps that order without building the chains (`suffix_index()`,
`components/kv/suffix_tails.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.policies.base import (
    CacheEntry,
    Chains,
    KeyScope,
    RankingPolicy,
    greedy_on_chains,
    register,
)
from cachepilot_sim.policies.lanes import Lane, LanedPolicy, LaneIndex, Walk, in_lane
from cachepilot_sim.policies.marconi_index import MarconiIndex, flops_of, utility
from cachepilot_sim.policies.reuse import GapEstimator


@dataclass
class MarconiConfig(PolicyConfig):
    """Marconi's knob: the weight of FLOP efficiency against recency in the utility."""

    name: str = "marconi"
    flop_weight: float = bounded(1.0, ge=0)


@register("marconi", config=MarconiConfig)
class MarconiPolicy(RankingPolicy):
    name = "marconi"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, MarconiConfig), type(cfg)  # the registry pairs them
        self.flop_weight = cfg.flop_weight
        self.recency_range = self.flops_range = (0.0, 0.0)  # (min, span) over the candidates

    def prepare(self, entries: Sequence[CacheEntry], now_us: int) -> None:
        """Both terms are min-max normalised over the candidates: record their ranges."""
        self.recency_range = _range([float(e.last_used_us) for e in entries])
        self.flops_range = _range([flops_of(e) for e in entries])

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        """Lowest utility first: normalised recency + flop_weight x normalised FLOP efficiency."""
        last_used, flops = float(entry.last_used_us), flops_of(entry)
        u = utility(last_used, flops, self.recency_range, self.flops_range, self.flop_weight)
        return (u, entry.entry_id)

    def set_index(self) -> MarconiIndex:
        """An exact index of the decision (ranges kept sorted, a best-first search bounded by
        the key's monotonicity: `policies/marconi_index.py`); on chains too (`KeyedTails`)."""
        return MarconiIndex(self)


def _range(values: list[float]) -> tuple[float, float]:
    """(minimum, span) of `values`; span 0 when empty or constant."""
    return (min(values), max(values) - min(values)) if values else (0.0, 0.0)


class _ClassReuse:
    """Per class: turns that ended (a gap started), gaps that ended in a return, their sum."""

    __slots__ = ("released", "returned", "gap_sum_us")

    def __init__(self) -> None:
        self.released = 0
        self.returned = 0
        self.gap_sum_us = 0.0


@register("wild")
class WildPolicy(LanedPolicy, RankingPolicy):
    name = "wild"
    key_scope = KeyScope.DECISION  # reuse probability decays with idle time

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.classes: dict[int, _ClassReuse] = {}

    def _cls(self, class_index: int) -> _ClassReuse:
        return self.classes.setdefault(class_index, _ClassReuse())

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        self._cls(entry.class_index).released += 1

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        c = self._cls(entry.class_index)
        c.returned += 1
        c.gap_sum_us += now_us - entry.last_used_us

    def reuse_probability(self, entry: CacheEntry, now_us: int) -> float:
        """q e^{-rt}(1 - e^{-r delta}) / (1 - q + q e^{-rt}): returns within delta given idle t,
        q the class's return fraction, r its exponential rate (the prior until a gap is seen)."""
        c = self._cls(entry.class_index)
        # Laplace: no data gives 1/2. A class can count more returns than releases (an entry used
        # again before its turn ended); capped, q stays below 1 and the denominator above 0.
        q = (min(c.returned, c.released) + 1) / (c.released + 2)
        mean_gap = c.gap_sum_us / c.returned if c.returned else self.estimator.population_gap_us
        rate = 1.0 / max(mean_gap, 1.0)
        alive = q * math.exp(-rate * max(now_us - entry.last_used_us, 0))
        return alive * -math.expm1(-rate * self.estimator.delta_us) / (1.0 - q + alive)

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (self.reuse_probability(entry, now_us), entry.last_used_us, entry.entry_id)

    def key_at(self, entry: CacheEntry, restore_us: float, now_us: int) -> tuple[float | int, ...]:
        return self.key(entry, now_us)

    def lane(self, entry: CacheEntry, restore_us: float, now_us: int) -> Lane:
        """The probability decays with idle time at a rate and fraction shared by the entry's
        class: within a class the longest idle entry ranks first, whatever its statistics."""
        return in_lane(entry.class_index, (entry.last_used_us, entry.entry_id), Walk.ROUNDED)

    # Its key reads neither the restore estimate nor the gap EMA: one index serves every regime.
    time_index_reads_restore = False


@dataclass
class TlruConfig(PolicyConfig):
    """T-LRU's knob: restore time (ms) under which losing a session's KV cannot breach the TTFT
    tail target."""

    name: str = "tlru"
    tlru_threshold_ms: float = bounded(200.0, ge=0)


@register("tlru", config=TlruConfig)
class TailLruPolicy(LanedPolicy, RankingPolicy):
    """Entries whose restore fits within `tlru_threshold_ms` first, each group LRU."""

    name = "tlru"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, TlruConfig), type(cfg)  # the registry pairs them
        self.threshold_us = cfg.tlru_threshold_ms * 1000.0

    # On whole entries (no chains) the key ranks each entry alone by the decision's restore
    # estimate: the session manager treats it as DECISION and keeps `time_index()` per regime.
    key_scope_on_entries = KeyScope.DECISION

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return self.key_at(entry, entry.restore_us, now_us)

    def key_at(self, entry: CacheEntry, restore_us: float, now_us: int) -> tuple[float | int, ...]:
        return (int(restore_us > self.threshold_us), entry.last_used_us, entry.entry_id)

    def lane(self, entry: CacheEntry, restore_us: float, now_us: int) -> Lane:
        """For a fixed restore estimate the key does not move: two LRU lanes, the entries whose
        restore fits within the threshold first (`time_index()`, the shared lane index)."""
        matters = int(restore_us > self.threshold_us)
        return in_lane(matters, (entry.last_used_us, entry.entry_id))

    def suffix_index(self) -> LaneIndex:
        """The same two lanes for chains, fed each tail's suffix restore (its own restore, or for
        a block a decision exposes, the snapshot's path below it too): the prefix manager's exact
        index of `select_victims` on chains (`components/kv/suffix_tails.py`)."""
        return LaneIndex(self)

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]:
        """On chains: a block matters when a next turn through it would restore more than the
        target if the chain were cut down to it (it, the blocks after it, and the longest path
        through the chains below); excess tails go first, each class LRU. (The forest path; the
        prefix manager decides through `suffix_index()`, with the same victims.)"""
        if chains is None or bytes_needed <= 0:
            return super().select_victims(entries, bytes_needed, now_us, chains, parents)
        limit_us = self.threshold_us
        below_us = [0.0] * len(chains)  # longest restore path through the chains below g
        for g in _bottom_up(parents, len(chains)):
            path_us = below_us[g] + sum(entries[i].restore_us for i in chains[g])
            up = parents[g] if parents else -1
            if up >= 0:
                below_us[up] = max(below_us[up], path_us)
        matters = [0] * len(entries)
        for g, chain in enumerate(chains):
            suffix_us = below_us[g]
            for i in reversed(chain):
                suffix_us += entries[i].restore_us
                matters[i] = int(suffix_us > limit_us)
        rank = [(matters[i], e.last_used_us, e.entry_id) for i, e in enumerate(entries)]
        picks = greedy_on_chains(rank, entries, chains, bytes_needed, parents)
        return [entries[i] for i in picks]


def _bottom_up(parents: Sequence[int] | None, num_chains: int) -> list[int]:
    """Chain indices with every chain listed before the chain above it."""
    if not parents:
        return list(range(num_chains))
    depth = [0] * num_chains
    for g in range(num_chains):
        h = g
        while parents[h] >= 0:
            h = parents[h]
            depth[g] += 1
    return sorted(range(num_chains), key=lambda g: (-depth[g], g))
