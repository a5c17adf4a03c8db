"""The segment trees behind Marconi's index (`policies/marconi_index.py`) and their bounds.

Every node keeps, over its live leaves, the smallest last use L, FLOPs per byte F and id, the
largest F, and the smallest L + c0 x F for the slope c0 the tree was built with. A decision with
ranges (low, span) for L and F and weight w ranks by (L - lowL) / spanL + w (F - lowF) / spanF,
which is (L + c F - lowL - c lowF) / spanL with c = w spanL / spanF: so for any leaf of a node,
L + c F >= min(L + c0 F) + (c - c0) F_extreme (F's minimum when c >= c0, else its maximum), a
bound that is exact at c = c0 and loosens with |c - c0| times the node's F range. `bound` takes
the larger of that (less a margin far above the rounding of either side: the key is a float) and
the corner bound (the key of (smallest L, smallest F): the key is monotone in both, rounding
included), so it never exceeds the float key of a leaf below. The corner bound alone opened every
cell along the frontier of what earlier decisions evicted; the linear one does not, while c stays
near c0 (a tree is rebuilt with the decision's slope when it has drifted and enough has happened
since its build to pay for it: `Forest.rebase`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_EMPTY = 1 << 62  # the id of a node without live leaves (above every entry id)
_INF = float("inf")
SMALL = 32  # slots of the arrival-order trees (and of the first level)
_MARGIN = 1e-12  # relative: far above the rounding of the key and of the linear bound
_PY_BUILD = 512  # trees of at most this many slots are built in Python
_DRIFT = 0.1  # relative slope change after which a tree is rebuilt (when it has paid for it)

Params = tuple[float, float, float, float, float, float]  # lowL, spanL, lowF, spanF, w, c


def _kd_order(last: np.ndarray, flops: np.ndarray, cap: int) -> np.ndarray:
    """Slots for `len(last)` entries and `cap - len(last)` empty ones (infinite coordinates, so
    last in every split): halves split at the median L, then F, alternately (a k-d tree), so a
    node's leaves are close in both and its bounds near them."""
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


class MinTree:
    """Entries in the slots of a segment tree, with each node's minima (and F's maximum)."""

    __slots__ = ("cap", "slope", "built_at", "last", "flops", "ids", "lin", "fmax", "leaf", "next")

    def __init__(
        self, cols: tuple[list[float], list[float], list[int]], cap: int, slope: float, at: int
    ) -> None:
        """Leaves (L, F, id columns) in k-d order, the free slots after them; built in NumPy."""
        last, flops, ids = cols
        n = len(ids)
        self.cap, self.slope, self.built_at = cap, slope, at
        if n == 0:  # an empty tree: no NumPy round trip
            self.last, self.flops, self.lin = (
                [_INF] * (2 * cap),
                [_INF] * (2 * cap),
                [_INF] * (2 * cap),
            )
            self.ids, self.fmax = [_EMPTY] * (2 * cap), [-_INF] * (2 * cap)
            self.next, self.leaf = cap, {}
            return
        lin = [x + slope * f for x, f in zip(last, flops, strict=True)]
        columns = ((last, _INF), (flops, _INF), (ids, _EMPTY), (lin, _INF), (flops, -_INF))
        arrays: list[list[Any]]
        if cap <= _PY_BUILD:  # small: in L order, built in Python (NumPy's calls cost more)
            order = sorted(range(n), key=last.__getitem__)
            arrays = [
                [fill] * cap + [values[j] for j in order] + [fill] * (cap - n)
                for values, fill in columns
            ]
            for a, (_, fill) in zip(arrays, columns, strict=True):
                pick = max if fill == -_INF else min
                for i in range(cap - 1, 0, -1):
                    a[i] = pick(a[2 * i], a[2 * i + 1])
        else:
            arrays = self._numpy_build(columns, n, cap)
        self.last, self.flops, self.ids, self.lin, self.fmax = arrays
        self.leaf = {eid: i for i, eid in enumerate(self.ids[cap:], cap) if eid != _EMPTY}
        # The free slots: those k-d order left after the last entry (the right half, when at
        # least half is free: infinite coordinates sort last in the first split).
        self.next = max(self.leaf.values()) + 1

    @staticmethod
    def _numpy_build(
        columns: tuple[tuple[list[Any], float | int], ...], n: int, cap: int
    ) -> list[list[Any]]:
        """Every column's leaves in k-d order and its nodes' extremes, in NumPy."""
        order = _kd_order(np.array(columns[0][0], dtype=float), np.array(columns[1][0]), cap)
        arrays = []
        for values, fill in columns:
            a = np.full(2 * cap, fill, dtype=np.int64 if fill == _EMPTY else float)
            a[cap : cap + n] = np.array(values, dtype=a.dtype)
            a[cap:] = a[cap:][order]
            combine = np.maximum if fill == -_INF else np.minimum
            size = cap
            while size > 1:  # nodes [size/2, size) from their children [size, 2 size)
                a[size // 2 : size] = combine(a[size : 2 * size : 2], a[size + 1 : 2 * size : 2])
                size //= 2
            arrays.append(a.tolist())
        return arrays

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
        self.lin[i], self.fmax[i] = last + self.slope * flops, flops
        self._up(i)

    def discard(self, entry_id: int) -> None:
        i = self.leaf.pop(entry_id)
        self.last[i], self.flops[i], self.ids[i], self.lin[i] = _INF, _INF, _EMPTY, _INF
        self.fmax[i] = -_INF
        self._up(i)

    def _up(self, i: int) -> None:
        """Recompute the extremes above leaf i, up to the first node they leave unchanged."""
        last, flops, ids, lin, fmax = self.last, self.flops, self.ids, self.lin, self.fmax
        i >>= 1
        while i:
            a, b = 2 * i, 2 * i + 1
            m1 = last[a] if last[a] <= last[b] else last[b]
            m2 = flops[a] if flops[a] <= flops[b] else flops[b]
            m3 = ids[a] if ids[a] <= ids[b] else ids[b]
            m4 = lin[a] if lin[a] <= lin[b] else lin[b]
            m5 = fmax[a] if fmax[a] >= fmax[b] else fmax[b]
            if (last[i], flops[i], ids[i], lin[i], fmax[i]) == (m1, m2, m3, m4, m5):
                return
            last[i], flops[i], ids[i], lin[i], fmax[i] = m1, m2, m3, m4, m5
            i >>= 1

    def bound(self, node: int, p: Params) -> float:
        """A lower bound of the float key of every live leaf below `node` (see the module)."""
        l_low, l_span, f_low, f_span, w, c = p
        r = 0.0 if l_span <= 0 else (self.last[node] - l_low) / l_span
        x = 0.0 if f_span <= 0 else (self.flops[node] - f_low) / f_span
        corner = r + w * x
        if l_span <= 0 or f_span <= 0 or c <= 0:  # c: 0 when not finite (`MarconiIndex.start`)
            return corner
        c0, lin, fext = self.slope, self.lin[node], self.fmax[node]
        if c >= c0:
            fext = self.flops[node]
        num = lin + (c - c0) * fext - l_low - c * f_low
        size = abs(lin) + (c + c0) * abs(fext) + abs(l_low) + c * abs(f_low)
        linear = num / l_span - _MARGIN * (size / l_span + 1.0 + w)
        return linear if linear > corner else corner


class Forest:
    """Searched entries in trees whose nodes are compact in (L, F). An entry that goes idle after
    every other (L at least the last one appended: an entry goes idle at its last use) is
    appended to `main`, in arrival order; `main` is rebuilt with twice its live entries' room
    when its slots run out. Any other entry (a parent a cut exposed, an entry indexed again) goes
    to static trees of doubling sizes (Bentley and Saxe's logarithmic method): appended to
    `small`, whose entries, when it fills, are rebuilt with those of the full levels above it as
    the next level. Each entry is rebuilt O(log n) times (in NumPy); a removal updates one root
    path. A new tree takes the candidates' slope at its build (`slope_now`)."""

    __slots__ = ("main", "main_last", "small", "levels", "where", "slope", "clock", "slope_now")

    def __init__(self, slope_now: Callable[[], float]) -> None:
        self.slope_now = slope_now  # the candidates' slope now, for a new tree
        self.slope = 0.0
        self.clock = 0  # insertions and decisions so far: what pays for a rebuild
        self.where: dict[int, MinTree] = {}
        self.main = self._tree(([], [], []), SMALL)
        self.main_last = -_INF  # the last L appended to main
        self.small = self._tree(([], [], []), SMALL)
        self.levels: list[MinTree | None] = []  # level k: at most SMALL * 2^(k+1) entries

    def _tree(self, cols: tuple[list[float], list[float], list[int]], cap: int) -> MinTree:
        tree = MinTree(cols, cap, self.slope_now(), self.clock)
        self.where.update(dict.fromkeys(cols[2], tree))
        return tree

    def __len__(self) -> int:
        return len(self.where)

    def trees(self) -> list[MinTree]:
        return [self.main, self.small, *(t for t in self.levels if t is not None and len(t))]

    def rebase(self, slope: float) -> None:
        """A decision's slope: trees built for one that differs by over `_DRIFT` are rebuilt
        with it, once insertions and decisions since their build number a quarter of them."""
        self.slope, self.clock = slope, self.clock + 1
        for k, tree in enumerate(self.levels):
            if tree is not None and self._drifted(tree):
                self.levels[k] = self._tree(tree.items(), tree.cap)
        if self._drifted(self.main):
            self.main = self._tree(self.main.items(), self.main.cap)

    def _drifted(self, tree: MinTree) -> bool:
        off = abs(self.slope - tree.slope) > _DRIFT * max(self.slope, tree.slope)
        return off and len(tree) > 0 and self.clock - tree.built_at >= len(tree)

    def add(self, entry_id: int, last: float, flops: float) -> None:
        tree = self.where.get(entry_id)
        if tree is not None:
            i = tree.leaf[entry_id]
            if tree.last[i] == last and tree.flops[i] == flops:
                return  # a refresh that moves nothing keeps its place
            tree.discard(entry_id)
        self.clock += 1
        if last >= self.main_last:
            if self.main.full():
                live = self.main.items()
                cap = SMALL
                while cap < 2 * len(live[2]):
                    cap *= 2
                self.main = self._tree(live, cap)
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
        cap = SMALL
        while cap < len(ids):
            cap *= 2
        self.levels[k] = self._tree((last, flops, ids), cap)
        self.small = self._tree(([], [], []), SMALL)
