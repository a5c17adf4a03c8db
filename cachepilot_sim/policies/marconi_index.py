"""An exact index for Marconi's utility: the smallest (recency + w x FLOP efficiency, id) first.

Both terms are min-max normalised over the decision's candidates, so the key of every entry moves
whenever the oldest or newest candidate, or the lightest or heaviest FLOPs per byte, changes: no
order between decisions ranks it. But the key is a non-decreasing function of each entry's
(last use L, FLOPs per byte F) at every decision, in floating point too: every step of
`utility` (a subtraction, a division by a positive span, a product with w >= 0, a sum) is
correctly rounded, hence monotone. So the key of any entry of a set is at least `utility` of the
set's smallest L and smallest F, and its id at least the set's smallest id: a lower bound of the
(key, id) order that holds with the decision's ranges, whatever they are.

The entries searched sit in segment trees (`_MinTree`, grouped by `_Forest`): each node keeps
its leaves' smallest L, F and id, updated along one root path on every insertion and removal.
Entries that go idle in L order are appended to one tree; the others go to static trees of
doubling sizes (Bentley and Saxe's logarithmic method); every rebuild lays leaves out as a k-d
tree (halves split at the median L, then F), so a node's corner bound is near its leaves. A
decision sets the ranges (`_Ranges`: sorted L and F of the candidates, the excluded one left out,
as `MarconiPolicy.prepare` computes them) and pops from a best-first search: a heap of nodes by
bound and of leaves by their exact key (`utility` of their own L and F: the policy's float), so
leaves come out in (key, id) order, the full sort's, ties and zero spans included. A node is
opened only when its bound is below the answer. `num_visits` counts heap pops: a few dozen per
victim on a fresh set; the nodes along the frontier of what earlier decisions evicted (their
corners lie below it) add about (that frontier's length) x sqrt(n) k-d cells, so a long run of
decisions from the same corner costs more than the first (`experiments/bench_eviction.md`).

The session manager searches every candidate (`add`, `select`). On prefix chains
(`components/kv/set_tails.py`, `KeyedTails`) the ranges are over every idle GPU block
(`add_candidate`) but only the current tails are searched (`add_tail`); a decision fixes the
ranges once, as the forest path's `prepare` does, and a parent that its cuts expose joins the
search with its exact key (`push_tail`), as greedy on chains pushes it.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np
from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry

if TYPE_CHECKING:
    from cachepilot_sim.policies.utility import MarconiPolicy

Range = tuple[float, float]  # (minimum, span) over the candidates
_EMPTY = 1 << 62  # the id of a node without live leaves (above every entry id)
_INF = float("inf")
_SMALL = 32  # slots of the arrival-order tree (and of the first level)


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


def _kd_order(last: np.ndarray, flops: np.ndarray, cap: int) -> np.ndarray:
    """Slots for `len(last)` entries and `cap - len(last)` empty ones (infinite coordinates, so
    last in every split): halves split at the median L, then F, alternately (a k-d tree), so a
    node's leaves are close in both and its corner (smallest L, smallest F) is near them."""
    n = len(last)
    coords = (np.append(last, np.full(cap - n, _INF)), np.append(flops, np.full(cap - n, _INF)))
    order = np.arange(cap)
    rows, depth = 1, 0
    while cap // rows > 1:
        seg = order.reshape(rows, cap // rows)
        by = np.argsort(coords[depth % 2][seg], axis=1, kind="stable")
        order = np.take_along_axis(seg, by, axis=1).reshape(-1)
        rows, depth = rows * 2, depth + 1
    return order


class _MinTree:
    """Entries in the slots of a segment tree; each node holds its leaves' smallest L, F, id."""

    __slots__ = ("cap", "last", "flops", "ids", "leaf", "next")

    def __init__(self, last: list[float], flops: list[float], ids: list[int], cap: int) -> None:
        """Leaves in k-d order (`_kd_order`), the free slots after them; minima built in NumPy."""
        n = len(ids)
        if n == 0:  # an empty tree: no NumPy round trip
            self.last, self.flops, self.ids = (
                [_INF] * (2 * cap),
                [_INF] * (2 * cap),
                [_EMPTY] * (2 * cap),
            )
            self.cap, self.next, self.leaf = cap, cap, {}
            return
        order = _kd_order(np.array(last, dtype=float), np.array(flops, dtype=float), cap)
        arrays = []
        for values, fill in ((last, _INF), (flops, _INF), (ids, _EMPTY)):
            a = np.full(2 * cap, fill, dtype=np.int64 if fill == _EMPTY else float)
            a[cap : cap + n] = np.array(values, dtype=a.dtype)
            a[cap:] = a[cap:][order]
            size = cap
            while size > 1:  # nodes [size/2, size) from their children [size, 2 size)
                a[size // 2 : size] = np.minimum(a[size : 2 * size : 2], a[size + 1 : 2 * size : 2])
                size //= 2
            arrays.append(a.tolist())
        self.last, self.flops, self.ids = arrays
        self.cap = cap
        self.leaf = {eid: i for i, eid in enumerate(self.ids[cap:], cap) if eid != _EMPTY}
        self.next = 2 * cap if n == cap else cap + n
        if n < cap:  # the free slots are the ones kd order left empty after the last entry
            self.next = max(self.leaf.values(), default=cap - 1) + 1

    def __len__(self) -> int:
        return len(self.leaf)

    def full(self) -> bool:
        return self.next == 2 * self.cap

    def items(self) -> tuple[list[float], list[float], list[int]]:
        """The live entries' (L, F, id) columns."""
        nodes = list(self.leaf.values())
        return [self.last[i] for i in nodes], [self.flops[i] for i in nodes], list(self.leaf)

    def append(self, entry_id: int, last: float, flops: float) -> None:
        """Put an entry in the next free slot (there is one: `full` is False)."""
        i = self.next
        self.next += 1
        self.leaf[entry_id] = i
        self.last[i], self.flops[i], self.ids[i] = last, flops, entry_id
        self._up(i)

    def discard(self, entry_id: int) -> None:
        i = self.leaf.pop(entry_id)
        self.last[i], self.flops[i], self.ids[i] = _INF, _INF, _EMPTY
        self._up(i)

    def _up(self, i: int) -> None:
        """Recompute the minima above leaf i, up to the first node they leave unchanged."""
        last, flops, ids = self.last, self.flops, self.ids
        i >>= 1
        while i:
            a, b = 2 * i, 2 * i + 1
            m1 = last[a] if last[a] <= last[b] else last[b]
            m2 = flops[a] if flops[a] <= flops[b] else flops[b]
            m3 = ids[a] if ids[a] <= ids[b] else ids[b]
            if last[i] == m1 and flops[i] == m2 and ids[i] == m3:
                return
            last[i], flops[i], ids[i] = m1, m2, m3
            i >>= 1


class _Forest:
    """Searched entries in trees whose leaves are close in L. An entry that goes idle after every
    other (L at least the last one appended: an entry goes idle at its last use) is appended to
    `main`, in arrival order, hence L order; `main` is rebuilt with twice its live entries' room
    when its slots run out. Any other entry (a parent a cut exposed, an entry indexed again) goes
    to static trees of doubling sizes, each in (L, id) order (Bentley and Saxe's logarithmic
    method): appended to `small`, whose entries, when it fills, are rebuilt with those of the
    full levels above it as the next level. Each entry is rebuilt O(log n) times (in NumPy) and a
    removal updates one root path."""

    __slots__ = ("main", "main_last", "small", "levels", "where")

    def __init__(self) -> None:
        self.main = _MinTree([], [], [], _SMALL)
        self.main_last = -_INF  # the last L appended to main
        self.small = _MinTree([], [], [], _SMALL)
        self.levels: list[_MinTree | None] = []  # level k: at most _SMALL * 2^(k+1) entries
        self.where: dict[int, _MinTree] = {}

    def __len__(self) -> int:
        return len(self.where)

    def trees(self) -> list[_MinTree]:
        return [self.main, self.small, *(t for t in self.levels if t is not None and len(t))]

    def add(self, entry_id: int, last: float, flops: float) -> None:
        tree = self.where.get(entry_id)
        if tree is not None:
            i = tree.leaf[entry_id]
            if tree.last[i] == last and tree.flops[i] == flops:
                return  # a refresh that moves nothing keeps its place
            tree.discard(entry_id)
        if last >= self.main_last:
            if self.main.full():
                live = self.main.items()
                cap = _SMALL
                while cap < 2 * len(live[2]):
                    cap *= 2
                self.main = _MinTree(*live, cap)
                self.where.update(dict.fromkeys(live[2], self.main))
            self.main_last = last
            tree = self.main
        else:
            if self.small.full():
                self._carry()
            tree = self.small
        tree.append(entry_id, last, flops)
        self.where[entry_id] = tree

    def discard(self, entry_id: int) -> None:
        tree = self.where.pop(entry_id, None)
        if tree is not None:
            tree.discard(entry_id)

    def _carry(self) -> None:
        last, flops, ids = self.small.items()
        k = 0
        while k < len(self.levels) and self.levels[k] is not None:
            more = self.levels[k].items()  # type: ignore[union-attr]
            last += more[0]
            flops += more[1]
            ids += more[2]
            self.levels[k] = None
            k += 1
        if k == len(self.levels):
            self.levels.append(None)
        cap = _SMALL
        while cap < len(ids):
            cap *= 2
        tree = self.levels[k] = _MinTree(last, flops, ids, cap)
        self.where.update(dict.fromkeys(ids, tree))
        self.small = _MinTree([], [], [], _SMALL)


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

    def __init__(self, policy: MarconiPolicy) -> None:
        self.policy = policy
        self.num_visits = 0  # heap items popped by decisions (a complexity probe for tests)
        self.entries: dict[int, CacheEntry] = {}  # entry id -> entry, searched or local
        self._ranges = _Ranges()
        self._tree = _Forest()
        self._heap: list[tuple[float, int, int, int]] = []  # this decision's search
        self._trees: list[_MinTree] = []  # the trees it searches
        self._params: tuple[Range, Range, float] = ((0.0, 0.0), (0.0, 0.0), 0.0)

    def __len__(self) -> int:
        return len(self._ranges.values)

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
        after) and a search from the root; False when there is no candidate."""
        got = self._ranges.ranges(exclude_id)
        if got is None:
            return False
        p = self.policy
        p.recency_range, p.flops_range = got
        self._params = (got[0], got[1], p.flop_weight)
        self._heap = []
        self._trees = self._tree.trees()
        for k in range(len(self._trees)):
            self._push(k, 1)
        return True

    def push_tail(self, entry: CacheEntry) -> None:
        """A block this decision's cuts made a tail (already a candidate): searched at once."""
        self.entries[entry.entry_id] = entry
        rr, fr, w = self._params
        key = utility(float(entry.last_used_us), flops_of(entry), rr, fr, w)
        heapq.heappush(self._heap, (key, entry.entry_id, -1, 0))

    def _push(self, k: int, node: int) -> None:
        t = self._trees[k]
        if t.ids[node] != _EMPTY:
            rr, fr, w = self._params
            bound = utility(t.last[node], t.flops[node], rr, fr, w)
            heapq.heappush(self._heap, (bound, t.ids[node], k, node))

    def pop_tail(self) -> int | None:
        """The id with the next smallest (key, id) of this decision; None when none is left.
        The caller drops what it cuts (`drop_tail`); the others stay."""
        heap, trees = self._heap, self._trees
        (l_low, l_span), (f_low, f_span), w = self._params
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
            last, flops = t.last, t.flops
            for c in (2 * node, 2 * node + 1):
                if ids[c] != _EMPTY:  # `utility` inlined (the same operations: the same float)
                    r = 0.0 if l_span <= 0 else (last[c] - l_low) / l_span
                    x = 0.0 if f_span <= 0 else (flops[c] - f_low) / f_span
                    push(heap, (r + w * x, ids[c], k, c))
        return None
