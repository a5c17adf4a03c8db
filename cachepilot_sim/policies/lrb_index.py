"""An exact index for LRB's key: (0, last use, id) beyond the boundary, else (1, -residual, id).

An entry idle x in feature bucket b is predicted to come back after residual(x) = G[k + (m - k)
// 2] - x, G the m gaps the bucket's predictor holds (sorted; the population's when the bucket
has too few) and k the number of them <= x (`GapModel.residual_us`); inf when k = m. The key
reads the decision's time only through x, and the predictor only through G, so for one G the
idle times x at which an entry is beyond the boundary B form a fixed set of intervals:
x in [G[k-1], min(G[k], G[mid_k] - floor(B))) for each k (residual - x is an integer, so
"> B" is "> floor(B)"), and x >= G[m-1]. They are computed once per version of G (the policy
counts observations per bucket) and merged.

Each bucket keeps its idle entries by (last use, id), and the buckets are kept by their oldest
entry. A query walks the buckets oldest first until a bucket's oldest entry is newer than the
best found: one bucket when the oldest entry of all is beyond the boundary (as it is once idle
longer than every gap its predictor holds), at most every bucket, never every entry. In a
bucket, from its oldest entry: an entry whose idle time lies in a beyond span is the bucket's
answer; else the next candidate is the first entry idle less than the top of the beyond span
below it (one bisection per alternation between the sides). The smallest (last use, id) over the
buckets is LRB's victim. Only when no entry is beyond the boundary anywhere are the others
ranked: inside a within span the residual gap - x is largest for its youngest entry and at most
gap - (span start), so spans are tried by that bound, down to the best residual found, and the
policy's own key picks among the candidates (ties by id). `now` may move either way.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry

Bucket = tuple[int, int, int]  # an entry's feature bucket (`LrbPolicy.bucket_of`)


class GapSource(Protocol):
    """The gaps that predict a bucket (`lrb.GapModel`)."""

    version: dict[Bucket, int]  # observations per bucket (its gaps changed)

    def source(self, bucket: Bucket) -> tuple[Bucket, SortedList | None]: ...


class LrbKey(Protocol):
    """What the index reads of LRB (`LrbPolicy`; no import of it)."""

    boundary_us: float

    @property
    def model(self) -> GapSource: ...

    def bucket_of(self, entry: CacheEntry) -> Bucket: ...

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]: ...


@dataclass(frozen=True, slots=True)
class _Spans:
    """Where one version of a bucket's gaps puts an idle entry: beyond the boundary for idle in
    [lows[j], highs[j]) (ascending, disjoint, merged), and the within spans as (bound on the
    residual, lo, hi, predicting gap), largest bound first."""

    lows: list[int]
    highs: list[float]
    within: list[tuple[int, int, float, int]]


class LrbIndex:
    """LRB's idle entries per feature bucket; `pop_min(now)` is the entry its sort puts first."""

    __slots__ = (
        "policy",
        "num_probes",
        "num_keyed",
        "_buckets",
        "_fronts",
        "_where",
        "_entries",
        "_spans",
    )

    def __init__(self, policy: LrbKey) -> None:
        self.policy = policy
        self.num_probes = 0  # bisections made by queries (a complexity probe)
        self.num_keyed = 0  # entries keyed with the policy's key by queries
        self._buckets: dict[Bucket, SortedList] = {}  # bucket -> (last use, id)
        self._fronts: SortedList = SortedList()  # (each bucket's oldest (last use, id), bucket)
        self._where: dict[int, tuple[Bucket, int]] = {}  # id -> (bucket, last use)
        self._entries: dict[int, CacheEntry] = {}
        # bucket whose gaps predict -> (their version, the spans they give)
        self._spans: dict[Bucket, tuple[int, _Spans]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry under its bucket as the policy keys it now (LRB reads neither the
        restore estimate nor the gap EMA the manager passes)."""
        eid = entry.entry_id
        self.discard(eid)
        bucket = self.policy.bucket_of(entry)
        items = self._buckets.setdefault(bucket, SortedList())
        item = (entry.last_used_us, eid)
        if not items or item < items[0]:
            if items:
                self._fronts.remove((items[0], bucket))
            self._fronts.add((item, bucket))
        items.add(item)
        self._where[eid] = (bucket, entry.last_used_us)
        self._entries[eid] = entry

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        where = self._where.pop(entry_id, None)
        if where is None:
            return
        bucket, last = where
        items = self._buckets[bucket]
        item = (last, entry_id)
        front = items[0] == item
        items.remove(item)
        if front:
            self._fronts.remove((item, bucket))
            if items:
                self._fronts.add((items[0], bucket))
        if not items:
            del self._buckets[bucket]
        del self._entries[entry_id]

    def _spans_of(self, bucket: Bucket) -> _Spans:
        """The idle-time spans beyond and within the boundary for the gaps that predict
        `bucket` now (computed once per version of those gaps)."""
        model = self.policy.model
        src, order = model.source(bucket)
        version = model.version.get(src, 0)
        cached = self._spans.get(src)
        if cached is not None and cached[0] == version:
            return cached[1]
        lows: list[int] = []  # beyond: [lows[j], highs[j]), ascending and disjoint
        highs: list[float] = []
        within: list[tuple[int, int, float, int]] = []  # (bound, lo, hi, gap) by bound desc
        gaps = list(order) if order else []
        m = len(gaps)
        floor_b = math.floor(self.policy.boundary_us)
        for k in range(m + 1):
            lo = gaps[k - 1] if k > 0 else 0
            hi: float = gaps[k] if k < m else math.inf
            gap = gaps[k + (m - k) // 2] if k < m else 0
            cut: float = gap - floor_b if k < m else math.inf  # beyond while idle < cut
            if lo < min(hi, cut):
                if highs and highs[-1] == lo:
                    highs[-1] = min(hi, cut)
                else:
                    lows.append(lo)
                    highs.append(min(hi, cut))
            if k < m and max(lo, cut) < hi:  # residual gap - idle, at most gap - start here
                start = int(max(lo, cut))
                within.append((gap - start, start, hi, gap))
        within.sort(key=lambda w: (-w[0], w[1]))
        spans = _Spans(lows, highs, within)
        self._spans[src] = (version, spans)
        return spans

    def _oldest_beyond(
        self, items: SortedList, spans: _Spans, now_us: int, best: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """The smallest (last use, id) among `best` and the bucket's entries beyond the
        boundary. From the oldest entry: if its idle time is in a beyond span it is the one;
        else the next candidates are idle less than the beyond span below its idle time (one
        bisection per alternation of the entries between the two sides)."""
        lows, highs = spans.lows, spans.highs
        below: float = math.inf  # look at entries idle less than this
        while True:
            self.num_probes += 1
            i = items.bisect_right((now_us - below, math.inf))  # first with idle < below
            if i == len(items):
                return best
            item = items[i]
            if best is not None and item > best:
                return best
            idle = max(now_us - item[0], 0)
            j = bisect_right(lows, idle) - 1
            if j < 0:
                return best  # no beyond span at or below its idle time
            if idle < highs[j]:
                return item
            below = highs[j]

    def _ranked_within(self, now_us: int) -> int | None:
        """No entry is beyond the boundary: in a within span the residual gap - idle is
        largest for its youngest entry, and at most gap - span start; spans are tried by that
        bound, down to the best residual found (ties: the policy's key decides, by id)."""
        key = self.policy.key
        best_residual = -math.inf
        cands: list[tuple[tuple[float | int, ...], int]] = []
        for bucket, items in self._buckets.items():
            for bound, lo, hi, gap in self._spans_of(bucket).within:
                if bound < best_residual:
                    break
                self.num_probes += 1
                top = math.inf if lo == 0 else now_us - lo
                i = items.bisect_right((top, math.inf)) - 1
                if i < 0 or items[i][0] <= now_us - hi:
                    continue  # no entry idle in [lo, hi)
                last = items[i][0]
                residual = gap - max(now_us - last, 0)
                if residual < best_residual:
                    continue
                best_residual = residual
                eid = items[items.bisect_left((last, -math.inf))][1]  # smallest id at that time
                self.num_keyed += 1
                cands.append((key(self._entries[eid], now_us), eid))
        return min(cands)[1] if cands else None

    def peek_min(self, now_us: int) -> int | None:
        """The id LRB's sort would put first at `now_us`, or None when empty."""
        best: tuple[int, int] | None = None
        for front, bucket in self._fronts:  # oldest first: the first hit bounds the rest
            if best is not None and front > best:
                break  # this bucket's oldest entry, and every later bucket's, is newer
            best = self._oldest_beyond(self._buckets[bucket], self._spans_of(bucket), now_us, best)
        if best is not None:
            return best[1]
        return self._ranked_within(now_us)

    def pop_min(self, now_us: int) -> int | None:
        """`peek_min`, and the entry leaves the index."""
        eid = self.peek_min(now_us)
        if eid is not None:
            self.discard(eid)
        return eid
