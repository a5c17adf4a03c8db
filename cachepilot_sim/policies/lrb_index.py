"""An exact index for LRB's key: (0, last use, id) beyond the boundary, else (1, -residual, id).

An entry idle x in feature bucket b is predicted to come back after residual(x) = G[k + (m - k)
// 2] - x, G the m gaps the bucket's predictor holds (sorted; the population's when the bucket
has too few) and k the number of them <= x (`GapModel.residual_us`); inf when k = m. The key
reads the decision's time only through x, and the predictor only through G, so for one G the
idle times x at which an entry is beyond the boundary B form a fixed set of intervals:
x in [G[k-1], min(G[k], G[mid_k] - floor(B))) for each k (residual - x is an integer, so
"> B" is "> floor(B)"), and x >= G[m-1]. They are computed once per version of G (the policy
counts observations per bucket) and merged.

Each bucket keeps its idle entries by (last use, id). A query walks every bucket with entries
(O(buckets), not O(entries)): the bucket's oldest entry beyond the boundary is the first entry
after the lower end of the oldest interval that holds one (a bisection per interval tried,
stopping at the first hit or once the intervals are newer than the best found); the smallest
(last use, id) over the buckets is LRB's victim. Only when no entry is beyond the boundary
anywhere are the others ranked: within one interval of a bucket the residual falls as x grows,
so the youngest entry of each interval is its candidate, and the policy's own key picks among
those. No simulator import; `now` may move either way.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry

if TYPE_CHECKING:
    from cachepilot_sim.policies.lrb import Bucket, LrbPolicy

Span = tuple[int, float, int]  # idle in [lo, hi); the gap index that predicts it (-1: none)


class LrbIndex:
    """LRB's idle entries per feature bucket; `pop_min(now)` is the entry its sort puts first."""

    __slots__ = ("policy", "num_probes", "num_keyed", "_buckets", "_where", "_entries", "_spans")

    def __init__(self, policy: LrbPolicy) -> None:
        self.policy = policy
        self.num_probes = 0  # bisections made by queries (a complexity probe)
        self.num_keyed = 0  # entries keyed with the policy's key by queries
        self._buckets: dict[Bucket, SortedList] = {}  # bucket -> (last use, id)
        self._where: dict[int, tuple[Bucket, int]] = {}  # id -> (bucket, last use)
        self._entries: dict[int, CacheEntry] = {}
        # (bucket whose gaps predict, its version) -> (beyond spans, within spans)
        self._spans: dict[Bucket, tuple[int, list[Span], list[Span]]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry under its bucket as the policy keys it now (LRB reads neither the
        restore estimate nor the gap EMA the manager passes)."""
        eid = entry.entry_id
        self.discard(eid)
        bucket = self.policy.bucket_of(entry)
        self._buckets.setdefault(bucket, SortedList()).add((entry.last_used_us, eid))
        self._where[eid] = (bucket, entry.last_used_us)
        self._entries[eid] = entry

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        where = self._where.pop(entry_id, None)
        if where is None:
            return
        bucket, last = where
        items = self._buckets[bucket]
        items.remove((last, entry_id))
        if not items:
            del self._buckets[bucket]
        del self._entries[entry_id]

    def _spans_of(self, bucket: Bucket) -> tuple[list[Span], list[Span]]:
        """Idle-time spans beyond the boundary (oldest first, merged) and within it (with the
        index of the gap that predicts each), for the gaps that predict `bucket` now."""
        model = self.policy.model
        src, order = model.source(bucket)
        version = model.version.get(src, 0)
        cached = self._spans.get(src)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        beyond: list[Span] = []
        within: list[Span] = []
        gaps = list(order) if order else []
        m = len(gaps)
        floor_b = math.floor(self.policy.boundary_us)
        for k in range(m + 1):
            lo = gaps[k - 1] if k > 0 else 0
            hi: float = gaps[k] if k < m else math.inf
            mid = k + (m - k) // 2
            cut = gaps[mid] - floor_b if k < m else math.inf
            if lo < min(hi, cut):  # residual > B below cut
                if beyond and beyond[-1][1] == lo:
                    beyond[-1] = (beyond[-1][0], min(hi, cut), -1)
                else:
                    beyond.append((lo, min(hi, cut), -1))
            if max(lo, cut) < hi:
                within.append((int(max(lo, cut)), hi, mid))
        beyond.reverse()  # oldest (longest idle) first
        self._spans[src] = (version, beyond, within)
        return beyond, within

    def _oldest_beyond(
        self, items: SortedList, spans: list[Span], now_us: int, best: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """The smallest (last use, id) among `best` and the bucket's entries beyond the
        boundary: entries idle in [lo, hi) have last use in (now - hi, now - lo]."""
        for lo, hi, _ in spans:
            after = now_us - hi
            if best is not None and after >= best[0]:
                break  # this span and the later ones hold only newer entries
            self.num_probes += 1
            i = items.bisect_right((after, math.inf))
            if i == len(items):
                break
            item = items[i]
            if lo == 0 or item[0] <= now_us - lo:  # idle is max(now - L, 0)
                return item if best is None or item < best else best
        return best

    def _ranked_within(self, now_us: int) -> int | None:
        """No entry is beyond the boundary: the youngest entry of each within-span of each
        bucket is a candidate (the residual falls with idle time inside a span); the policy's
        key picks among them."""
        key = self.policy.key
        best: tuple[tuple[float | int, ...], int] | None = None
        for bucket, items in self._buckets.items():
            for lo, hi, _ in self._spans_of(bucket)[1]:
                self.num_probes += 1
                top = math.inf if lo == 0 else now_us - lo
                i = items.bisect_right((top, math.inf)) - 1
                if i < 0 or items[i][0] <= now_us - hi:
                    continue
                last = items[i][0]
                eid = items[items.bisect_left((last, -math.inf))][1]  # smallest id at that time
                self.num_keyed += 1
                cand = (key(self._entries[eid], now_us), eid)
                if best is None or cand < best:
                    best = cand
        return None if best is None else best[1]

    def peek_min(self, now_us: int) -> int | None:
        """The id LRB's sort would put first at `now_us`, or None when empty."""
        best: tuple[int, int] | None = None
        for bucket, items in self._buckets.items():
            if best is not None and items[0] > best:
                continue  # its oldest entry is newer than the best
            best = self._oldest_beyond(items, self._spans_of(bucket)[0], now_us, best)
        if best is not None:
            return best[1]
        return self._ranked_within(now_us)

    def pop_min(self, now_us: int) -> int | None:
        """`peek_min`, and the entry leaves the index."""
        eid = self.peek_min(now_us)
        if eid is not None:
            self.discard(eid)
        return eid
