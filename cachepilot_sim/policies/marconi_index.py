"""An exact index for Marconi's utility: the smallest (recency + w x FLOP efficiency, id) first.

Both terms are min-max normalised over the decision's candidates, so the key of every entry moves
whenever the oldest or newest candidate, or the lightest or heaviest FLOPs per byte, changes: no
order between decisions ranks it. But the key is a non-decreasing function of each entry's
(last use L, FLOPs per byte F) at every decision, in floating point too: every step of
`utility` (a subtraction, a division by a positive span, a product with w >= 0, a sum) is
correctly rounded, hence monotone. So the key of any entry of a set is at least `utility` of the
set's smallest L and smallest F, and its id at least the set's smallest id: a lower bound of the
(key, id) order that holds with the decision's ranges, whatever they are.

The entries searched sit in segment trees (`policies/marconi_trees.py`): each node keeps its
leaves' smallest L, F and id, and two more extremes that give a second, linear bound (the key is
(L + c F - const) / span for a slope c per decision). A decision sets the ranges (`_Ranges`:
sorted L and F of the candidates, the excluded one left out, as `MarconiPolicy.prepare` computes
them) and pops from a best-first search: a heap of nodes by bound and of leaves by their exact key
(`utility` of their own L and F: the policy's float), so leaves come out in (key, id) order, the
full sort's, ties and zero spans included. A node is opened only when its bound is below the
answer: `num_visits` counts heap pops, about 15 per victim at 10^4 entries, early and late in a
run (`tests/property/test_marconi_index.py`).

The session manager searches every candidate (`add`, `select`). On prefix chains
(`components/kv/set_tails.py`, `KeyedTails`) the ranges are over every idle GPU block
(`add_candidate`) but only the current tails are searched (`add_tail`); a decision fixes the
ranges once, as the forest path's `prepare` does, and a parent that its cuts expose joins the
search with its exact key (`push_tail`), as greedy on chains pushes it.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry
from cachepilot_sim.policies.marconi_trees import _EMPTY, Forest, MinTree, Params

Range = tuple[float, float]  # (minimum, span) over the candidates


class MarconiKey(Protocol):
    """What the index reads and sets of Marconi (`MarconiPolicy`; no import of it)."""

    flop_weight: float
    recency_range: Range
    flops_range: Range


def flops_of(entry: CacheEntry) -> float:
    """Recompute work saved per byte kept (recompute_us stands in for FLOPs)."""
    return entry.recompute_us / max(entry.num_bytes, 1)


def utility(last_used: float, flops: float, recency: Range, flop_range: Range, w: float) -> float:
    """Normalised recency + w x normalised FLOP efficiency; a term whose span is 0 is 0. Monotone
    in `last_used` and `flops` (see the module docstring): the index's bounds rely on it."""
    low, span = recency
    r = 0.0 if span <= 0 else (last_used - low) / span
    low, span = flop_range
    x = 0.0 if span <= 0 else (flops - low) / span
    return r + w * x


class _Ranges:
    """The candidates' last uses and FLOPs per byte, sorted: their ranges in O(1)."""

    __slots__ = ("values", "last", "flops")

    def __init__(self) -> None:
        self.values: dict[int, tuple[float, float]] = {}  # entry id -> (L, F)
        self.last: SortedList = SortedList()
        self.flops: SortedList = SortedList()

    def add(self, entry: CacheEntry) -> None:
        lu, f = float(entry.last_used_us), flops_of(entry)
        if self.values.get(entry.entry_id) == (lu, f):
            return
        self.discard(entry.entry_id)
        self.values[entry.entry_id] = (lu, f)
        self.last.add(lu)
        self.flops.add(f)

    def discard(self, entry_id: int) -> None:
        got = self.values.pop(entry_id, None)
        if got is not None:
            self.last.remove(got[0])
            self.flops.remove(got[1])

    def ranges(self, exclude_id: int) -> tuple[Range, Range] | None:
        """`MarconiPolicy.prepare`'s ranges over the candidates but `exclude_id`; None when
        there is none."""
        ex = self.values.get(exclude_id)
        if len(self.values) - (ex is not None) <= 0:
            return None
        return _span(self.last, None if ex is None else ex[0]), _span(
            self.flops, None if ex is None else ex[1]
        )


def _span(values: SortedList, excluded: float | None) -> Range:
    """(min, max - min) of `values` with one occurrence of `excluded` left out."""
    low = values[1] if excluded is not None and values[0] == excluded else values[0]
    high = values[-2] if excluded is not None and values[-1] == excluded else values[-1]
    return (low, high - low)


class MarconiIndex:
    """Marconi's candidates; `select` answers the full sort's greedy decision (see above)."""

    __slots__ = (
        "policy",
        "num_visits",
        "entries",
        "_ranges",
        "_tree",
        "_heap",
        "_params",
        "_trees",
    )

    def __init__(self, policy: MarconiKey) -> None:
        self.policy = policy
        self.num_visits = 0  # heap items popped by decisions (a complexity probe for tests)
        self.entries: dict[int, CacheEntry] = {}  # entry id -> entry, searched or local
        self._ranges = _Ranges()
        self._tree = Forest(self._slope_now)
        self._heap: list[tuple[float, int, int, int]] = []  # this decision's search
        self._trees: list[MinTree] = []  # the trees it searches
        self._params: Params = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def __len__(self) -> int:
        return len(self._ranges.values)

    def _slope_now(self) -> float:
        """w x spanL / spanF over every candidate: the slope a decision would have now."""
        got = self._ranges.ranges(-1)
        if got is None or got[0][1] <= 0 or got[1][1] <= 0:
            return 0.0
        slope = self.policy.flop_weight * got[0][1] / got[1][1]
        return slope if slope < math.inf else 0.0

    # -- whole entries (the session manager): every candidate is searched -------------------
    def add(self, entry: CacheEntry) -> None:
        """Index an idle candidate (again: its last use or size may have moved)."""
        self.add_candidate(entry)
        self.add_tail(entry)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        self.discard_candidate(entry_id)
        self.drop_tail(entry_id)

    def select(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[CacheEntry]:
        """`MarconiPolicy.select_victims` over every candidate but `exclude_id`: the smallest
        (key, id) until `bytes_needed` are covered. The policy's ranges are this decision's."""
        if bytes_needed <= 0 or not self.start(exclude_id):
            return []
        victims: list[CacheEntry] = []
        freed = 0
        while freed < bytes_needed:
            entry_id = self.pop_tail()
            if entry_id is None:
                break
            if entry_id != exclude_id:
                victims.append(self.entries[entry_id])
                freed += victims[-1].num_bytes
        return victims

    # -- chains (the prefix manager): ranges over the candidates, search over the tails -------
    def add_candidate(self, entry: CacheEntry) -> None:
        """An idle block (a forest block): it counts in the ranges."""
        self._ranges.add(entry)

    def discard_candidate(self, entry_id: int) -> None:
        self._ranges.discard(entry_id)

    def add_tail(self, entry: CacheEntry) -> None:
        """A candidate that may be cut now: searched by decisions."""
        self.entries[entry.entry_id] = entry
        self._tree.add(entry.entry_id, float(entry.last_used_us), flops_of(entry))

    def drop_tail(self, entry_id: int) -> None:
        self.entries.pop(entry_id, None)
        self._tree.discard(entry_id)

    def start(self, exclude_id: int = -1) -> bool:
        """Begin a decision: the ranges of `prepare` (set on the policy, whose `key` reads them
        after) and a search from the roots; False when there is no candidate."""
        got = self._ranges.ranges(exclude_id)
        if got is None:
            return False
        p = self.policy
        p.recency_range, p.flops_range = got
        (l_low, l_span), (f_low, f_span), w = got[0], got[1], p.flop_weight
        slope = w * l_span / f_span if l_span > 0 and f_span > 0 else 0.0
        slope = slope if slope < math.inf else 0.0  # an overflow: the corner bound alone
        if slope > 0:
            self._tree.rebase(slope)
        self._params = (l_low, l_span, f_low, f_span, w, slope)
        self._heap = []
        self._trees = self._tree.trees()
        for k, t in enumerate(self._trees):
            if t.ids[1] != _EMPTY:
                self._heap.append((t.bound(1, self._params), t.ids[1], k, 1))
        heapq.heapify(self._heap)
        return True

    def push_tail(self, entry: CacheEntry) -> None:
        """A block this decision's cuts made a tail (already a candidate): searched at once."""
        self.entries[entry.entry_id] = entry
        l_low, l_span, f_low, f_span, w, _ = self._params
        lu, f = float(entry.last_used_us), flops_of(entry)
        key = utility(lu, f, (l_low, l_span), (f_low, f_span), w)
        heapq.heappush(self._heap, (key, entry.entry_id, -1, 0))

    def pop_tail(self) -> int | None:
        """The id with the next smallest (key, id) of this decision; None when none is left.
        The caller drops what it cuts (`drop_tail`); the others stay."""
        heap, trees, params = self._heap, self._trees, self._params
        l_low, l_span, f_low, f_span, w, _ = params
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, entry_id, k, node = pop(heap)
            self.num_visits += 1
            if k < 0:  # an exact key: a pushed tail
                return entry_id
            t = trees[k]
            ids = t.ids
            if node >= t.cap:  # an exact key: a leaf, searched while it stays
                if ids[node] == entry_id:
                    return entry_id
                continue
            for c in (2 * node, 2 * node + 1):
                if ids[c] == _EMPTY:
                    continue
                if c < t.cap:
                    push(heap, (t.bound(c, params), ids[c], k, c))
                else:  # a leaf's exact key: `utility` inlined (the same operations and float)
                    r = 0.0 if l_span <= 0 else (t.last[c] - l_low) / l_span
                    x = 0.0 if f_span <= 0 else (t.flops[c] - f_low) / f_span
                    push(heap, (r + w * x, ids[c], k, c))
        return None
