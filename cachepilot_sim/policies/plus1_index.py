"""An exact index for perc_plus1's decision over whole entries: greedy by PERC's ratio plus one
covering entry, without keying every candidate.

`greedy_plus_one` (`knapsack_greedy.py`) walks every candidate in ratio order (cost / size, ties
by position), keeping a partial set S that never covers the need (an item that would complete
the cover is skipped), and after every change of S prices S + the cheapest item j not in S with
size_j >= need - size(S) (cost, ties by position); the first strictly cheapest candidate wins.
Cost = P(resume within δ) × restore decays with idle time, so both orders are PERC's decaying key
(`perc_index.py`): a `PercIndex` keyed by ratio (weight restore / size) and one keyed by cost
(weight restore, size 1) per *size class* (sizes with the same bit length, [2^(b-1), 2^b)). Item
ids are positions: a stamp taken when the entry first joins the candidates (a re-key keeps it),
so ties fall as in the full path's `(key, i)`, `i` the position in the candidate order.

A decision then touches only what can change the answer:

* the walk reads only the classes whose sizes can still join S (size <= need - size(S) - 1: the
  bound only falls, so a class above it is skipped for good, as the full walk would skip each of
  its items); the next item of the walk is the smallest head among them, and an item of the one
  class straddling the bound that does not fit is skipped as the full walk skips it (once the
  skips outnumber that class's fitting items / `_DIRECT_PER_POP`, its fitting items are keyed
  one by one instead, from a `SortedList` by size);
* the cover query reads the classes whose sizes all cover in the order of a lower bound on their
  cost now (`_ClassBound`: the smallest restore times the P of the largest gap any item of the
  class can have, lowered by a relative slack far above rounding), stops at the first class
  whose bound exceeds the best minimum read so far, and pops, in cost order, the class
  straddling need - size(S) until an item covers or cannot beat that minimum (or, past a budget
  of its covering items / `_DIRECT_PER_POP` pops, keys its covering items one by one);
* the walk stops once cost(S) (the same `math.fsum`) is at least the best candidate's cost: every
  later candidate costs at least that, and only a strictly cheaper one replaces the best; or once
  no class can grow S.

Items popped by a decision go back (the victims leave); the excluded entry leaves for the decision
and comes back with its position. Keys are computed as `expected_costs` computes them (the same
float operations; `math.expm1` equals NumPy's on these arguments, which the equality tests check).
Cost: O(|S| + the classes read) `PercIndex` queries per decision, plus the straddling classes'
pops or direct keys: items of one size class around the need, not the candidate set; that is
the worst case, O(class) when the need falls inside a class and its smaller entries are cheaper
(16 ms a decision at 10^5 entries and a 1000 MiB need, 0.9 ms at a 64 MiB one:
`experiments/bench_eviction.md`; a hierarchy of size ranges would bound it). When the
candidates' total is below the need every candidate is a victim (O(n), as the answer is).
"""

from __future__ import annotations

import math

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry
from cachepilot_sim.policies.perc_index import BLOCK_ITEMS, PercIndex
from cachepilot_sim.policies.reuse import GapEstimator

Item = tuple[int, int, float, float, int]  # (stamp, last_used_us, gap EMA or -1, restore, size)
Head = tuple[float, int]  # (key, stamp)
# A class's cost bound is lowered by this factor: far above the rounding of a key (~1e-16).
_SLACK = 1e-9
# The straddling class's cheaper items are popped in cost order (a `PercIndex` query each) until
# one covers, or its covering items are keyed one by one (about 1 µs each, 50-100x less), once
# the pops reach their number / this.
_DIRECT_PER_POP = 32


class _ClassBound:
    """A lower bound on the cost of every item of a size class at a time: the smallest restore
    times the P of the largest gap any item can have (the oldest last use, the largest own gap
    EMA or the population's), so a cover query skips the classes that cannot beat its best."""

    __slots__ = ("restores", "lasts", "bases", "num_none", "sizes")

    def __init__(self) -> None:
        self.sizes: SortedList = SortedList()  # (size, stamp): the covering part is a suffix
        self.restores: SortedList = SortedList()
        self.lasts: SortedList = SortedList()
        self.bases: SortedList = SortedList()  # own gap EMAs
        self.num_none = 0  # items without an own gap EMA (the population's applies)

    def add(self, item: Item) -> None:
        self.sizes.add((item[4], item[0]))
        self.restores.add(item[3])
        self.lasts.add(item[1])
        if item[2] >= 0:
            self.bases.add(item[2])
        else:
            self.num_none += 1

    def remove(self, item: Item) -> None:
        self.sizes.remove((item[4], item[0]))
        self.restores.remove(item[3])
        self.lasts.remove(item[1])
        if item[2] >= 0:
            self.bases.remove(item[2])
        else:
            self.num_none -= 1

    def bound(self, now_us: int, delta_us: float, population_gap_us: float) -> float:
        """At most the cost (P x restore) of every item of the class now."""
        base = self.bases[-1] if self.bases else 0.0
        if self.num_none:
            base = max(base, population_gap_us)
        g = max(base, float(now_us - self.lasts[0]), 1.0)
        p = -math.expm1(-delta_us / g)
        return p * self.restores[0] * (1.0 - _SLACK)


class PlusOneIndex:
    """Idle entries of one restore regime, answering `greedy_plus_one` over all of them."""

    __slots__ = (
        "estimator",
        "block_items",
        "num_visits",
        "num_direct",
        "_items",
        "_ids",
        "_ratio",
        "_cost",
        "_bounds",
        "_total",
        "_next",
    )

    def __init__(self, estimator: GapEstimator, block_items: int = BLOCK_ITEMS) -> None:
        self.estimator = estimator
        self.block_items = block_items
        self.num_visits = 0  # heads read and items popped by decisions (a complexity probe)
        self.num_direct = 0  # straddling items keyed one by one (a complexity probe)
        self._items: dict[int, Item] = {}  # entry id -> item
        self._ids: dict[int, int] = {}  # stamp -> entry id
        self._ratio: dict[int, PercIndex] = {}  # size class -> items by (cost / size, stamp)
        self._cost: dict[int, PercIndex] = {}  # size class -> items by (cost, stamp)
        self._bounds: dict[int, _ClassBound] = {}  # size class -> its cost bound
        self._total = 0  # bytes of the indexed items
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def num_keyed(self) -> int:
        """Exact keys computed by the classes' `PercIndex` queries (a complexity probe)."""
        indexes = [*self._ratio.values(), *self._cost.values()]
        return sum(x.num_keyed for x in indexes)

    # -- membership -------------------------------------------------------------------------
    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry (again after a re-key: it keeps its position)."""
        old = self._items.get(entry.entry_id)
        if old is not None:
            self._unindex(old)
            stamp = old[0]
        else:
            stamp = self._next
            self._next += 1
            self._ids[stamp] = entry.entry_id
        item = (stamp, entry.last_used_us, float(gap_ema_us), float(restore_us))
        self._items[entry.entry_id] = (*item, max(entry.num_bytes, 1))
        self._index(self._items[entry.entry_id])

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        item = self._items.pop(entry_id, None)
        if item is not None:
            self._unindex(item)
            del self._ids[item[0]]

    def _index(self, item: Item) -> None:
        stamp, last_used, gap, restore, size = item
        b = size.bit_length()
        if b not in self._ratio:
            self._ratio[b] = PercIndex(self.estimator.delta_us, self.block_items)
            self._cost[b] = PercIndex(self.estimator.delta_us, self.block_items)
            self._bounds[b] = _ClassBound()
        self._bounds[b].add(item)
        self._ratio[b].add(stamp, last_used, gap, restore, float(size))
        self._cost[b].add(stamp, last_used, gap, restore, 1.0)
        self._total += size

    def _unindex(self, item: Item) -> None:
        b = item[4].bit_length()
        self._ratio[b].discard(item[0])
        self._cost[b].discard(item[0])
        self._bounds[b].remove(item)
        self._total -= item[4]
        if not len(self._ratio[b]):
            del self._ratio[b], self._cost[b], self._bounds[b]

    # -- the decision ----------------------------------------------------------------------
    def decide(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[int]:
        """The ids `PercPlusOnePolicy.select_victims` picks among every indexed entry but
        `exclude_id`, in its order; they leave the index."""
        held = self._items.get(exclude_id)
        if held is not None:
            self._unindex(held)
        try:
            if bytes_needed <= 0 or not self._total:
                return []
            if self._total < bytes_needed:  # every candidate, in position order
                stamps = sorted(s for s, eid in self._ids.items() if eid != exclude_id)
                victims = [self._ids[s] for s in stamps]
            else:
                victims = _Decision(self, bytes_needed, now_us).run()
        finally:
            if held is not None:
                self._index(held)
        for eid in victims:
            self.discard(eid)
        return victims


class _Decision:
    """One `greedy_plus_one` run over the classes of a `PlusOneIndex` at a fixed time."""

    def __init__(self, owner: PlusOneIndex, need: int, now_us: int) -> None:
        self.owner = owner
        self.need = need
        self.now = now_us
        est = owner.estimator
        self.delta = est.delta_us
        self.pop_gap = est.population_gap_us
        self.ratio_heads: dict[int, Head | None] = {}  # class -> cached head of the walk
        self.cost_mins: dict[int, Head | None] = {}  # class -> cached cheapest item
        # To put back after the decision: (index, item, size it is keyed with there).
        self.popped: list[tuple[PercIndex, Item, float]] = []
        self.in_s: set[int] = set()  # stamps of the partial set S
        self.skips: dict[int, int] = {}  # class -> misfits the walk popped from it
        self.direct: set[int] = set()  # classes whose fitting items the walk keys one by one

    def _item(self, stamp: int) -> Item:
        return self.owner._items[self.owner._ids[stamp]]

    def cost(self, item: Item) -> float:
        """`expected_costs`' value for the item now (the same float operations)."""
        _, last_used, gap, restore, _ = item
        base = gap if gap >= 0 else self.pop_gap
        g = max(max(base, float(self.now - last_used)), 1.0)
        return -math.expm1(-self.delta / g) * restore

    def _head(self, index: PercIndex, per_byte: bool) -> Head | None:
        stamp = index.peek_min(self.now, self.pop_gap)
        if stamp is None:
            return None
        self.owner.num_visits += 1
        item = self._item(stamp)
        c = self.cost(item)
        return (c / item[4] if per_byte else c, stamp)

    def _pop(self, index: PercIndex, stamp: int) -> Item:
        item = self._item(stamp)
        index.discard(stamp)
        self.popped.append((index, item, float(item[4])))
        return item

    def ratio_head(self, b: int) -> Head | None:
        if b not in self.ratio_heads:
            self.ratio_heads[b] = self._head(self.owner._ratio[b], True)
        return self.ratio_heads[b]

    def cost_min(self, b: int) -> Head | None:
        if b not in self.cost_mins:
            self.cost_mins[b] = self._head(self.owner._cost[b], False)
        return self.cost_mins[b]

    def next_fitting(self, limit: int) -> Item | None:
        """Pop the walk's next item whose size is at most `limit`, skipping (popping) those of
        the straddling class that exceed it; None when no class can give one."""
        classes = [b for b in self.owner._ratio if 1 << (b - 1) <= limit]
        while True:
            best: tuple[Head, int] | None = None
            for b in classes:
                h = self.fitting_min(b, limit) if b in self.direct else self.ratio_head(b)
                if h is not None and (best is None or h < best[0]):
                    best = (h, b)
            if best is None:
                return None
            (_, stamp), b = best
            item = self._pop(self.owner._ratio[b], stamp)
            self.ratio_heads.pop(b, None)
            if item[4] <= limit:
                return item
            self.skips[b] = self.skips.get(b, 0) + 1  # skipped for good (the limit only falls)
            sizes = self.owner._bounds[b].sizes
            if self.skips[b] > sizes.bisect_right((limit, math.inf)) // _DIRECT_PER_POP:
                self.direct.add(b)

    def fitting_min(self, b: int, limit: int) -> Head | None:
        """The smallest (ratio, stamp) among class b's items not in S of size <= `limit`, keyed
        one by one (the class's misfits ahead of them in ratio order are many)."""
        sizes = self.owner._bounds[b].sizes
        best: Head | None = None
        for _, stamp in sizes.islice(0, sizes.bisect_right((limit, math.inf))):
            if stamp in self.in_s:
                continue
            self.owner.num_direct += 1
            item = self._item(stamp)
            h = (self.cost(item) / item[4], stamp)
            if best is None or h < best:
                best = h
        return best

    def cheapest_cover(self, rest: int) -> Head | None:
        """The smallest (cost, stamp) among the items not in S with size >= `rest`."""
        best: Head | None = None
        straddling = -1
        covering: list[tuple[float, int]] = []  # (cost bound, class) of the classes that cover
        for b, bound in self.owner._bounds.items():
            if 1 << (b - 1) >= rest:
                covering.append((bound.bound(self.now, self.delta, self.pop_gap), b))
            elif (1 << b) - 1 >= rest:
                straddling = b
        for lower, b in sorted(covering):
            if best is not None and lower > best[0]:
                break  # this class and the rest cost more than the best: none can win
            h = self.cost_min(b)
            if h is not None and (best is None or h < best):
                best = h
        if straddling < 0:
            return best
        sizes = self.owner._bounds[straddling].sizes
        first = sizes.bisect_left((rest, -1))
        budget = (len(sizes) - first) // _DIRECT_PER_POP
        index = self.owner._cost[straddling]
        taken: list[Item] = []
        found: Head | None = None
        while True:
            if len(taken) >= budget:  # key the covering suffix instead
                for _, stamp in sizes.islice(first):
                    if stamp in self.in_s:
                        continue
                    self.owner.num_direct += 1
                    h = (self.cost(self._item(stamp)), stamp)
                    if found is None or h < found:
                        found = h
                break
            h = self._head(index, False)
            if h is None or (best is not None and h > best):
                break
            item = self._item(h[1])
            index.discard(h[1])
            taken.append(item)
            if item[4] >= rest:
                found = h
                break
        for item in taken:  # back at once: a smaller rest may make them cover
            index.add(item[0], item[1], item[2], item[3], 1.0)
        if found is None or (best is not None and best < found):
            return best
        return found

    def run(self) -> list[int]:
        owner = self.owner
        partial: list[Item] = []
        costs: list[float] = []
        size = 0
        best: list[int] | None = None
        best_cost = math.inf
        try:
            while True:
                cover = self.cheapest_cover(self.need - size)
                if cover is not None:
                    cost = math.fsum(costs) + cover[0]
                    if cost < best_cost:
                        best = [*(it[0] for it in partial), cover[1]]
                        best_cost = cost
                if math.fsum(costs) >= best_cost:
                    break  # every later candidate costs at least this much: none is cheaper
                item = self.next_fitting(self.need - size - 1)
                if item is None:
                    break
                partial.append(item)
                self.in_s.add(item[0])
                costs.append(self.cost(item))
                size += item[4]
                b = item[4].bit_length()
                owner._cost[b].discard(item[0])  # in S: no longer a covering item
                self.popped.append((owner._cost[b], item, 1.0))
                self.cost_mins.pop(b, None)
        finally:
            for index, it, keyed_size in self.popped:
                index.add(it[0], it[1], it[2], it[3], keyed_size)
        assert best is not None  # the candidates' total covers the need
        return [owner._ids[s] for s in best]
