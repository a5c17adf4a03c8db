"""An exact index for PERC's time-dependent eviction key: the smallest key, keying few items.

PERC ranks an idle item by key = P(resume within δ) × w, P = 1 − exp(−δ / g), w = cost / size,
g = max(base, now − L, 1): L is when the item went idle, base its own gap estimate (fixed while it
is idle) or, for an item without one, the population's (a query argument: it moves with every
observation). Ties go to the smaller item id. The key decays as the item stays idle, so a heap of
keys goes stale; this index answers "which item has the smallest (key, id) at `now`" exactly:

* an item with its own base is *young* while now − L < max(base, 1): g is its base, the key is
  constant, the young are a `SortedList` by (key, id), and a heap of expiry times moves each one
  out, once, when a query's `now` passes L + ⌈base⌉;
* after that it is *dormant*: g = now − L, P a decreasing function of idle time. A query walks the
  dormant items in L order (`_LOrder`, blocks with NumPy minima) by branch and bound: an item is
  keyed only if its w is below the smallest w seen so far (an earlier, so longer idle, item with
  a smaller w beats it: the *records* of w, about ln n of them on unordered weights), and below
  best key / P(last keyed item) (every later item has at least that P). Equal weights over
  distinct idle times therefore key two items, not n;
* items without a base share g = max(population, now − L, 1): the dormant ones (L ≤ now −
  ⌈max(population, 1)⌉) are an L-prefix, walked as above; the young ones share P, so a
  `SortedList` by (w, id) read from the front keys only those whose w is within the slack of the
  smallest young w (or of best key / P).

Exactness against the plain sort: keys are computed as `PercPolicy.score` computes them
(`p * cost / size`: same operations, same order; regrouping them as p × (cost / size) changes
the headline run, ties between keys a few units in the last place apart being real). Pruning keeps
a relative slack (`_SLACK`), far above the rounding error of a key (about 10⁻¹⁵): an item it skips
has a key larger by more than any rounding, so it loses to a keyed item under exact float
comparison too, and items whose weights are equal up to the slack are all keyed, ties going by id
as in the sort. The one costly case: many young items without a base whose weights are equal
(restore exactly proportional to bytes) are all keyed: O(that group) per query.

`now` must not decrease from one query to the next (expiry is processed once). No simulator
import: the vLLM integration uses it as well.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right

import numpy as np
from sortedcontainers import SortedList

# A skipped item's weight exceeds the running minimum by this factor: far above rounding error.
_SLACK = 1e-9
# Rebuild the expiry heap when it holds more than this many entries per young item (plus a
# floor): discarded or re-added items leave theirs behind, and an index that no query advances
# (a restore regime no decision reads) would otherwise keep one per add for good.
_EXPIRY_COMPACT_FACTOR = 2
_EXPIRY_COMPACT_FLOOR = 64
BLOCK_ITEMS = 256  # items per block of the L order (split at twice this)
_FINITE_MAX = float(np.finfo(np.float64).max)

Pos = tuple[int, int]  # (block, offset)


class _LOrder:
    """Items ordered by (L, id), each with a weight, in blocks; finds the next item whose weight
    is at most a threshold by skipping blocks whose minimum is above it (NumPy scans)."""

    __slots__ = ("block", "keys", "ws", "counts", "maxes", "bmin", "num_scans")

    def __init__(self, block: int) -> None:
        self.block = block
        self.keys: list[list[tuple[int, int]]] = []
        self.ws: list[np.ndarray] = []  # per block, capacity 2 * block + 1, first counts[k] used
        self.counts: list[int] = []
        self.maxes: list[tuple[int, int]] = []  # last key of each block
        self.bmin = np.empty(0)  # minimum weight of each block
        self.num_scans = 0  # NumPy scans made by `next_at_most` (a complexity probe)

    def insert(self, key: tuple[int, int], w: float) -> None:
        """Add an item with key (L, id) and weight w."""
        half_size = self.block
        if not self.keys:
            arr = np.empty(2 * half_size + 1)
            arr[0] = w
            self.keys, self.ws, self.counts, self.maxes = [[key]], [arr], [1], [key]
            self.bmin = np.array([w])
            return
        k = min(bisect_left(self.maxes, key), len(self.keys) - 1)
        keys, arr, n = self.keys[k], self.ws[k], self.counts[k]
        i = bisect_left(keys, key)
        keys.insert(i, key)
        arr[i + 1 : n + 1] = arr[i:n]
        arr[i] = w
        n += 1
        self.counts[k] = n
        self.maxes[k] = keys[-1]
        if w < self.bmin[k]:
            self.bmin[k] = w
        if n > 2 * half_size:  # split in halves
            half = np.empty(2 * half_size + 1)
            half[: n - half_size] = arr[half_size:n]
            self.keys.insert(k + 1, keys[half_size:])
            del keys[half_size:]
            self.ws.insert(k + 1, half)
            self.counts[k] = half_size
            self.counts.insert(k + 1, n - half_size)
            self.maxes[k] = keys[-1]
            self.maxes.insert(k + 1, self.keys[k + 1][-1])
            self.bmin = np.insert(self.bmin, k + 1, 0.0)
            self.bmin[k] = arr[:half_size].min()
            self.bmin[k + 1] = half[: n - half_size].min()

    def remove(self, key: tuple[int, int]) -> None:
        """Remove the item with key (L, id); it must be present."""
        k = bisect_left(self.maxes, key)
        keys, arr, n = self.keys[k], self.ws[k], self.counts[k]
        i = bisect_left(keys, key)
        del keys[i]
        w = arr[i]
        arr[i : n - 1] = arr[i + 1 : n]
        n -= 1
        if n == 0:
            del self.keys[k], self.ws[k], self.counts[k], self.maxes[k]
            self.bmin = np.delete(self.bmin, k)
            return
        self.counts[k] = n
        self.maxes[k] = keys[-1]
        if w == self.bmin[k]:
            self.bmin[k] = arr[:n].min()

    def split(self, key: tuple[int, int] | tuple[int, float]) -> Pos:
        """Position of the first item with (L, id) > key."""
        k = bisect_right(self.maxes, key)  # type: ignore[arg-type]
        if k == len(self.keys):
            return (k, 0)
        return (k, bisect_right(self.keys[k], key))  # type: ignore[arg-type]

    def next_at_most(self, pos: Pos, thr: float) -> Pos | None:
        """First position at or after `pos` whose weight is at most `thr`, or None."""
        k, i = pos
        if k >= len(self.keys):
            return None
        self.num_scans += 1
        if i < self.counts[k]:
            hits = self.ws[k][i : self.counts[k]] <= thr
            j = int(hits.argmax())
            if hits[j]:
                return (k, i + j)
        if k + 1 >= len(self.keys):
            return None
        self.num_scans += 1
        hits = self.bmin[k + 1 :] <= thr
        j = int(hits.argmax())
        if not hits[j]:
            return None
        k += 1 + j
        self.num_scans += 1
        j = int((self.ws[k][: self.counts[k]] <= thr).argmax())
        return (k, j)


class PercIndex:
    """Idle items under PERC's key; `peek_min`/`pop_min` give exactly the item with the smallest
    (p × cost / size, id), p = −expm1(−δ / max(base, now − L, 1)), as a full sort would.

    `add(item_id, last_used_us, own_gap_us, cost, size=1)`: own_gap_us < 0 means "no estimate of
    its own" (the query's population gap applies); with size 1, cost is the weight. Adding an id
    already present replaces it. Weights (cost / size) must be finite and non-negative.
    `block_items` sizes the blocks of the idle-order scans (tests use small blocks for splits).
    """

    __slots__ = (
        "delta_us",
        "num_keyed",
        "_items",
        "_young",
        "_young_key",
        "_expiry",
        "_own",
        "_none",
        "_none_by_w",
        "_last_now",
    )

    def __init__(self, delta_us: float, block_items: int = BLOCK_ITEMS) -> None:
        if not delta_us > 0:
            raise ValueError(f"PercIndex: delta_us must be > 0, got {delta_us}")
        if block_items < 1:
            raise ValueError(f"PercIndex: block_items must be >= 1, got {block_items}")
        self.delta_us = float(delta_us)
        self.num_keyed = 0  # items keyed by queries (a complexity probe for tests)
        # id -> (last_used_us, base or -1, cost, size, weight = cost / size)
        self._items: dict[int, tuple[int, float, float, float, float]] = {}
        self._young: SortedList = SortedList()  # (key, id) of young items with a base
        self._young_key: dict[int, tuple[float, int]] = {}  # id -> (key, expiry_us)
        self._expiry: list[tuple[int, int]] = []  # (expiry_us, id), lazily invalidated
        self._own = _LOrder(block_items)  # dormant items with a base, by (L, id)
        self._none = _LOrder(block_items)  # items without a base, by (L, id)
        self._none_by_w: SortedList = SortedList()  # (w, id) of items without a base
        self._last_now: int | None = None

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item_id: int) -> bool:
        return item_id in self._items

    def _p(self, gap: float) -> float:
        return -math.expm1(-self.delta_us / gap)

    def add(
        self, item_id: int, last_used_us: int, own_gap_us: float, cost: float, size: float = 1.0
    ) -> None:
        """Index an idle item (replacing any item with the same id); its weight is cost / size."""
        cost, size = float(cost), float(size)
        w = cost / size
        if not (0.0 <= w < math.inf):
            raise ValueError(f"PercIndex.add: item {item_id} has weight {w}, need finite >= 0")
        if item_id in self._items:
            self.discard(item_id)
        last_used_us = int(last_used_us)
        base = float(own_gap_us)
        self._items[item_id] = (last_used_us, base, cost, size, w)
        if base < 0:
            self._none.insert((last_used_us, item_id), w)
            self._none_by_w.add((w, item_id))
            return
        b = max(base, 1.0)
        expiry = last_used_us + math.ceil(b)
        if self._last_now is not None and expiry <= self._last_now:
            self._own.insert((last_used_us, item_id), w)  # already dormant
            return
        key = self._p(b) * cost / size
        self._young.add((key, item_id))
        self._young_key[item_id] = (key, expiry)
        heapq.heappush(self._expiry, (expiry, item_id))
        if (
            len(self._expiry)
            > _EXPIRY_COMPACT_FACTOR * len(self._young_key) + _EXPIRY_COMPACT_FLOOR
        ):
            self._compact_expiry()

    def _compact_expiry(self) -> None:
        """Keep one heap entry per young item, its current one: `advance` pops the same live
        (expiry, id) pairs in the same order (they are distinct) and skipped the rest."""
        self._expiry = [(expiry, item_id) for item_id, (_, expiry) in self._young_key.items()]
        heapq.heapify(self._expiry)

    def discard(self, item_id: int) -> None:
        """Forget an item (no-op when absent)."""
        item = self._items.pop(item_id, None)
        if item is None:
            return
        last_used_us, base, _, _, w = item
        if base < 0:
            self._none.remove((last_used_us, item_id))
            self._none_by_w.remove((w, item_id))
            return
        young = self._young_key.pop(item_id, None)
        if young is not None:
            self._young.remove((young[0], item_id))
        else:
            self._own.remove((last_used_us, item_id))

    def advance(self, now_us: int) -> None:
        """Set the clock: young items whose base has passed become dormant (each once). Queries
        call it; call it before loading many items that are already dormant, or the first query
        moves all of them (one O(n log n) step, not a per-query cost)."""
        if self._last_now is not None and now_us < self._last_now:
            raise ValueError(f"PercIndex: time went back from {self._last_now} to {now_us}")
        self._last_now = now_us
        heap = self._expiry
        while heap and heap[0][0] <= now_us:
            expiry, item_id = heapq.heappop(heap)
            young = self._young_key.get(item_id)
            if young is None or young[1] != expiry:
                continue  # stale: discarded or re-added since
            del self._young_key[item_id]
            self._young.remove((young[0], item_id))
            item = self._items[item_id]
            self._own.insert((item[0], item_id), item[4])

    def _walk(
        self, order: _LOrder, end: Pos, now_us: int, best: tuple[float, int] | None
    ) -> tuple[float, int] | None:
        """The smallest (key, id) among `best` and the dormant items of `order` before `end`."""
        items, m, pos, p_last = self._items, math.inf, (0, 0), 0.0
        slack = 1.0 + _SLACK
        while True:
            thr = m * slack if m < math.inf else _FINITE_MAX
            if best is not None and p_last > 0.0:
                thr = min(thr, best[0] * slack / p_last)
            found = order.next_at_most(pos, thr)
            if found is None or found >= end:
                return best
            k, i = found
            item_id = order.keys[k][i][1]
            last_used_us, _, cost, size, w = items[item_id]
            self.num_keyed += 1
            p_last = self._p(float(now_us - last_used_us))
            cand = (p_last * cost / size, item_id)
            if best is None or cand < best:
                best = cand
            m = min(m, w)
            pos = (k, i + 1)

    def _young_none(
        self, now_us: int, pb: float, best: tuple[float, int] | None
    ) -> tuple[float, int] | None:
        """The smallest (key, id) among `best` and the young items without a base: they share p,
        so only those whose w is within the slack of the smallest (or of best / p) are keyed."""
        by_w, items = self._none_by_w, self._items
        p0 = self._p(pb)
        bound = now_us - math.ceil(pb)  # L at or below: dormant (walked already)
        slack = 1.0 + _SLACK
        thr = best[0] * slack / p0 if best is not None else math.inf
        for w, item_id in by_w:
            if w > thr:
                break  # every later item has a larger w: a larger key, beyond rounding
            last_used_us, _, cost, size, _ = items[item_id]
            if last_used_us <= bound:
                continue  # dormant: keyed by the walk (skipped here only near the boundary)
            self.num_keyed += 1
            cand = (p0 * cost / size, item_id)
            if best is None or cand < best:
                best = cand
            thr = min(thr, w * slack)
        return best

    def peek_min(self, now_us: int, population_gap_us: float) -> int | None:
        """The id with the smallest (key, id) at `now_us`, or None when empty."""
        self.advance(now_us)
        best: tuple[float, int] | None = self._young[0] if self._young else None
        best = self._walk(self._own, (len(self._own.keys), 0), now_us, best)
        if self._none.keys:
            pb = max(float(population_gap_us), 1.0)
            end = self._none.split((now_us - math.ceil(pb), math.inf))
            best = self._walk(self._none, end, now_us, best)
            best = self._young_none(now_us, pb, best)
        return None if best is None else best[1]

    def pop_min(self, now_us: int, population_gap_us: float) -> int | None:
        """`peek_min`, and the item leaves the index."""
        item_id = self.peek_min(now_us, population_gap_us)
        if item_id is not None:
            self.discard(item_id)
        return item_id

    def num_scans(self) -> int:
        """NumPy block scans made so far (a complexity probe)."""
        return self._own.num_scans + self._none.num_scans
