"""LRB-style relaxed Belady (Song et al., "Learning Relaxed Belady for Content Distribution Network
Caching", NSDI'20; sunnyszy/lrb) for KV entries: evict an entry whose next access is predicted
beyond a boundary, the predictor learned online from the reuse gaps the run has observed.

Belady evicts the entry reused furthest in the future; relaxed Belady only needs one reused beyond
a boundary, which is easier to predict than the exact time. Where this differs from the paper:
the predictor is an empirical distribution of observed gaps per feature bucket (class, uses, the
session's gap EMA), not LightGBM over 32 past deltas and decayed counters; it predicts the gap left
given the time already idle (the paper's age feature, here by conditioning); every idle entry is
ranked rather than 64 sampled; the boundary is a config field, not learned from Belady's decisions
on the past window; and among entries beyond it the least recently used goes first. Decisions pop
from an exact index of the key (`policies/lrb_index.py`): O(feature buckets), not O(entries).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sortedcontainers import SortedList

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.lrb_index import Bucket, LrbIndex
from cachepilot_sim.policies.reuse import GapEstimator

_ALL: Bucket = (-1, -1, -1)  # the population: every observed gap


@dataclass
class LrbConfig(PolicyConfig):
    """LRB's knobs: the relaxed-Belady boundary and the learning window (gaps kept per bucket)."""

    name: str = "lrb"
    lrb_boundary_s: float = bounded(30.0, gt=0)
    lrb_window_gaps: int = bounded(256, ge=8, integer=True)
    lrb_min_gaps: int = bounded(8, ge=1, integer=True)  # fewer in a bucket: use the population


class GapModel:
    """Recent observed gaps per feature bucket (a sliding window each), and the population."""

    def __init__(self, window: int, min_gaps: int) -> None:
        self.window = window
        self.min_gaps = min_gaps
        self.recent: dict[Bucket, deque[int]] = {}
        self.sorted: dict[Bucket, SortedList] = {}
        self.version: dict[Bucket, int] = {}  # observations per bucket (its gaps changed)
        self.num_observed = 0

    def observe(self, bucket: Bucket, gap_us: int) -> None:
        """Add one observed gap to its bucket and the population (the oldest leaves a full one)."""
        self.num_observed += 1
        for b in (bucket, _ALL):
            recent = self.recent.setdefault(b, deque())
            order = self.sorted.setdefault(b, SortedList())
            recent.append(gap_us)
            order.add(gap_us)
            self.version[b] = self.version.get(b, 0) + 1
            if len(recent) > self.window:
                order.remove(recent.popleft())

    def source(self, bucket: Bucket) -> tuple[Bucket, SortedList | None]:
        """The bucket whose gaps predict `bucket` (itself, or the population when it has too
        few) and those gaps."""
        order = self.sorted.get(bucket)
        if order is None or len(order) < self.min_gaps:
            return _ALL, self.sorted.get(_ALL)
        return bucket, order

    def residual_us(self, bucket: Bucket, idle_us: int) -> float:
        """Median gap left for an entry idle `idle_us`, among the gaps longer than that in its
        bucket (the population when its bucket has too few); inf when none was that long."""
        order = self.source(bucket)[1]
        if not order:
            return math.inf
        first = order.bisect_right(idle_us)
        longer = len(order) - first
        if longer == 0:
            return math.inf
        return float(order[first + longer // 2] - idle_us)


def feature_bucket(entry: CacheEntry) -> Bucket:
    """(class, uses capped at 4, log2 of the session's gap EMA in seconds, -1 when none)."""
    gap = entry.gap_ema_us
    gap_bin = -1 if gap < 0 else min(max(int(math.log2(max(gap, 1.0) / 1e6)) + 4, 0), 16)
    return (entry.class_index, min(entry.num_uses, 4), gap_bin)


@register("lrb", config=LrbConfig)
class LrbPolicy(RankingPolicy):
    """Entries whose predicted next access lies beyond the boundary first (least recently used
    first), then the rest, furthest predicted next access first (Belady on the prediction).

    The features are read when an entry goes idle and the gap it ends with is their label. The
    key reads the decision's time (the idle time conditions the prediction): DECISION scope.
    """

    name = "lrb"
    key_scope = KeyScope.DECISION
    time_index_reads_restore = False  # one index serves every decision, whatever the restore

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, LrbConfig), type(cfg)  # the registry pairs them
        self.boundary_us = cfg.lrb_boundary_s * 1e6
        self.model = GapModel(cfg.lrb_window_gaps, cfg.lrb_min_gaps)
        self.features: dict[int, Bucket] = {}  # entry id -> bucket when it last went idle

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        """A gap starts: remember the features it will be the label of."""
        self.features[entry.entry_id] = feature_bucket(entry)

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        """A gap ended: one training example (features at its start, its length)."""
        bucket = self.features.pop(entry.entry_id, None)
        if bucket is not None:
            self.model.observe(bucket, max(now_us - entry.last_used_us, 0))

    def bucket_of(self, entry: CacheEntry) -> Bucket:
        """The features the entry is predicted from: those of its release, else its own now."""
        return self.features.get(entry.entry_id) or feature_bucket(entry)

    def predicted_residual_us(self, entry: CacheEntry, now_us: int) -> float:
        """The predicted time to the entry's next access (inf: not seen coming back)."""
        return self.model.residual_us(self.bucket_of(entry), max(now_us - entry.last_used_us, 0))

    def time_index(self) -> LrbIndex:
        """An exact index of this key (`policies/lrb_index.py`): a decision looks at each
        feature bucket's oldest entry beyond the boundary, not at every entry."""
        return LrbIndex(self)

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        residual = self.predicted_residual_us(entry, now_us)
        if residual > self.boundary_us:
            return (0, float(entry.last_used_us), entry.entry_id)
        return (1, -residual, entry.entry_id)

    def metrics(self) -> dict[str, float]:
        """How many gaps the predictor learned from."""
        return {"lrb_gaps_observed": float(self.model.num_observed)}
