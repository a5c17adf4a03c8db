"""Choose-victims as a 0/1 covering knapsack: free at least `need` bytes at least total cost.

Items are grouped into ordered chains (root first); from a chain only a tail may be cut, so choosing
item j of a chain forces every item after j (prefix-sharing block chains: a shared prefix cannot go
before the blocks that extend it). Chains may hang below others (`parents`: a prefix tree cut into
chains at its branch points): a chain's items may go only once every chain below it is cut whole.
Whole-session eviction is the special case of one-item chains without parents.
Exact solvers: dynamic programming over size units (the gcd of the sizes) when the table is small,
`scipy.optimize.milp` (HiGHS) otherwise, with a time limit and the proven gap when it hits it.
Heuristics: greedy by cost/size (PERC's rule) and greedy plus one covering item (a 2-approximation).
Pure functions; see docs/perc_proof.md for the statements and proofs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A DP table larger than this (need units x items) goes to the MILP instead.
DEFAULT_MAX_DP_CELLS = 4_000_000


@dataclass(frozen=True, slots=True)
class CoverProblem:
    """Sizes (bytes, > 0) and costs (>= 0) per item; chains partition the items, root first.

    parents[g] is the chain whose tail item is the parent of chain g's root (-1: none); empty when
    every chain is free-standing.
    """

    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    need: int
    chains: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...] = ()

    @staticmethod
    def of(sizes: Sequence[int], costs: Sequence[float], need: int,
           chains: Sequence[Sequence[int]] | None = None,
           parents: Sequence[int] | None = None) -> CoverProblem:
        """Build and check a problem; chains default to one per item (whole-session entries)."""
        n = len(sizes)
        if len(costs) != n:
            raise ValueError(f"{n} sizes but {len(costs)} costs")
        if any(s <= 0 for s in sizes) or any(not c >= 0 for c in costs):
            raise ValueError("sizes must be > 0 and costs >= 0 (and not NaN)")
        groups = tuple(tuple(c) for c in chains) if chains is not None else tuple(
            (i,) for i in range(n))
        flat = sorted(i for g in groups for i in g)
        if flat != list(range(n)) or any(len(g) == 0 for g in groups):
            raise ValueError("chains must partition the item indices 0..n-1 without empty chains")
        links = tuple(int(p) for p in parents) if parents is not None else ()
        if links and (len(links) != len(groups) or not _is_forest(links)):
            raise ValueError("parents must give one chain index (or -1) per chain, without cycles")
        if all(p < 0 for p in links):
            links = ()
        return CoverProblem(tuple(int(s) for s in sizes), tuple(float(c) for c in costs),
                            int(need), groups, links)

    @property
    def total_size(self) -> int:
        return sum(self.sizes)

    def is_feasible_set(self, chosen: Sequence[int]) -> bool:
        """True when `chosen` respects the chains (each chain's chosen items form a tail, and a
        chain with a chosen item has every chain below it chosen whole)."""
        picked = set(chosen)
        for chain in self.chains:
            flags = [i in picked for i in chain]
            if any(flags) and not all(flags[flags.index(True):]):
                return False
        for g, p in enumerate(self.parents):
            if p >= 0 and self.chains[p][-1] in picked and self.chains[g][0] not in picked:
                return False
        return True

    def cost_of(self, chosen: Sequence[int]) -> float:
        return math.fsum(self.costs[i] for i in chosen)

    def size_of(self, chosen: Sequence[int]) -> int:
        return sum(self.sizes[i] for i in chosen)


@dataclass(frozen=True, slots=True)
class CoverSolution:
    """chosen: item indices; covers: frees >= need (False only when even every item is too little).

    bound is a proven lower bound on the optimal cost: equal to `cost` when `optimal`.
    """

    chosen: tuple[int, ...]
    cost: float
    covers: bool
    optimal: bool
    bound: float
    method: str

    @property
    def gap(self) -> float:
        """Relative gap of `cost` over the proven bound (0 when optimal)."""
        return 0.0 if self.optimal else (self.cost - self.bound) / max(self.cost, 1e-12)


def _is_forest(parents: Sequence[int]) -> bool:
    n = len(parents)
    for g in range(n):
        seen, h = 0, g
        while h >= 0:
            if h >= n or seen > n:
                return False
            h, seen = parents[h], seen + 1
    return True


def _everything(p: CoverProblem, method: str) -> CoverSolution:
    """Need larger than everything: all items are the only answer (it cannot cover)."""
    chosen = tuple(range(len(p.sizes)))
    cost = p.cost_of(chosen)
    return CoverSolution(chosen, cost, p.total_size >= p.need, True, cost, method)


def solve_dp(p: CoverProblem) -> CoverSolution:
    """Exact DP over chains: best[c] = least cost freeing >= c units; option k cuts k tail items."""
    if p.need <= 0:
        return CoverSolution((), 0.0, True, True, 0.0, "dp")
    if p.total_size < p.need:
        return _everything(p, "dp")
    if p.parents:
        return _solve_forest_dp(p)
    unit = math.gcd(*p.sizes)
    num_units = -(-p.need // unit)
    grid = np.arange(num_units + 1)
    best = np.where(grid == 0, 0.0, np.inf)
    picks = np.zeros((len(p.chains), num_units + 1), dtype=np.int32)
    for g, chain in enumerate(p.chains):
        new = best.copy()
        size = cost = 0.0
        for k, item in enumerate(reversed(chain), start=1):
            size += p.sizes[item] // unit
            cost += p.costs[item]
            cand = best[np.maximum(grid - int(size), 0)] + cost
            better = cand < new
            new[better] = cand[better]
            picks[g, better] = k
        best = new
    chosen: list[int] = []
    c = num_units
    for g in range(len(p.chains) - 1, -1, -1):
        k = int(picks[g, c])
        if k:
            tail = p.chains[g][len(p.chains[g]) - k:]
            chosen.extend(tail)
            c = max(c - sum(p.sizes[i] for i in tail) // unit, 0)
    chosen.sort()
    cost = p.cost_of(chosen)
    return CoverSolution(tuple(chosen), cost, True, True, cost, "dp")


def _min_plus(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """c[u] = min over v <= u of a[v] + b[u - v] (both: least cost freeing >= units), argmin v."""
    m = len(a)
    u, v = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    table = np.where(v <= u, a[v] + b[np.maximum(u - v, 0)], np.inf)
    arg = np.argmin(table, axis=1)
    return table[np.arange(m), arg], arg


def _solve_forest_dp(p: CoverProblem) -> CoverSolution:
    """Exact DP over a forest of chains: f_g[u] = least cost freeing >= u units below and in g.

    Either g keeps its items and its child chains share u (min-plus convolution), or every chain
    below g goes whole and g loses a tail of k items. Cost: chains x units^2.
    """
    unit = math.gcd(*p.sizes)
    num_units = -(-p.need // unit)
    grid = np.arange(num_units + 1)
    kids: list[list[int]] = [[] for _ in p.chains]
    roots: list[int] = []
    for g, parent in enumerate(p.parents):
        (kids[parent] if parent >= 0 else roots).append(g)
    f: dict[int, np.ndarray] = {}
    whole: dict[int, tuple[int, float]] = {}  # units, cost of cutting the subtree whole
    split: dict[int, list[np.ndarray]] = {}  # per child: units given to it, by demand
    cut: dict[int, np.ndarray] = {}  # items of g cut, by demand (0: g kept)

    def visit(g: int) -> None:
        acc = np.where(grid == 0, 0.0, np.inf)
        size, cost = 0, 0.0
        split[g] = []
        for h in kids[g]:
            visit(h)
            acc, arg = _min_plus(acc, f[h])
            split[g].append(arg)
            size, cost = size + whole[h][0], cost + whole[h][1]
        best, picks = acc.copy(), np.zeros(num_units + 1, dtype=np.int32)
        for k, item in enumerate(reversed(p.chains[g]), start=1):
            size += p.sizes[item] // unit
            cost += p.costs[item]
            better = (grid <= size) & (cost < best)
            best[better] = cost
            picks[better] = k
        f[g], whole[g], cut[g] = best, (size, cost), picks

    def collect(g: int, u: int, out: list[int]) -> None:
        k = int(cut[g][u])
        if k:  # every chain below goes whole, then g's tail of k items
            out.extend(p.chains[g][len(p.chains[g]) - k:])
            for h in kids[g]:
                _all_below(h, out)
            return
        for h, arg in zip(reversed(kids[g]), reversed(split[g]), strict=True):
            v = int(arg[u])  # demand left for the children before h
            collect(h, u - v, out)
            u = v

    def _all_below(g: int, out: list[int]) -> None:
        out.extend(p.chains[g])
        for h in kids[g]:
            _all_below(h, out)

    acc = np.where(grid == 0, 0.0, np.inf)
    args = []
    for r in roots:
        visit(r)
        acc, arg = _min_plus(acc, f[r])
        args.append(arg)
    chosen: list[int] = []
    u = num_units
    for r, arg in zip(reversed(roots), reversed(args), strict=True):
        v = int(arg[u])
        collect(r, u - v, chosen)
        u = v
    chosen.sort()
    total = p.cost_of(chosen)
    return CoverSolution(tuple(chosen), total, True, True, total, "dp")


def solve_milp(p: CoverProblem, time_limit_s: float = 1.0) -> CoverSolution:
    """Exact by HiGHS branch and bound; at the time limit, the incumbent and its proven gap."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    if p.need <= 0:
        return CoverSolution((), 0.0, True, True, 0.0, "milp")
    if p.total_size < p.need:
        return _everything(p, "milp")
    n = len(p.sizes)
    unit = math.gcd(*p.sizes)
    sizes = np.array([s // unit for s in p.sizes], dtype=np.float64)
    rows, cols, vals = [], [], []
    num_rows = 0
    for chain in p.chains:  # x[parent] <= x[child]: cutting an item cuts everything after it
        for parent, child in zip(chain, chain[1:], strict=False):
            rows += [num_rows, num_rows]
            cols += [parent, child]
            vals += [1.0, -1.0]
            num_rows += 1
    for g, up in enumerate(p.parents):  # the tail of the chain above goes only after g's root
        if up >= 0:
            rows += [num_rows, num_rows]
            cols += [p.chains[up][-1], p.chains[g][0]]
            vals += [1.0, -1.0]
            num_rows += 1
    constraints = [LinearConstraint(sizes[None, :], lb=-(-p.need // unit), ub=np.inf)]
    if num_rows:
        a = coo_array((vals, (rows, cols)), shape=(num_rows, n)).tocsr()
        constraints.append(LinearConstraint(a, lb=-np.inf, ub=0.0))
    res = milp(np.array(p.costs), constraints=constraints, integrality=np.ones(n),
               bounds=Bounds(0, 1), options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})
    if res.x is None:  # no incumbent within the limit: fall back to the greedy set
        fallback = tuple(greedy_by_ratio(p))
        bound = float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
        cost = p.cost_of(fallback)
        return CoverSolution(fallback, cost, True, False, min(bound, cost), "milp")
    chosen = tuple(int(i) for i in np.flatnonzero(res.x > 0.5))
    cost = p.cost_of(chosen)
    optimal = res.status == 0
    bound = cost if optimal else min(float(res.mip_dual_bound), cost)
    return CoverSolution(chosen, cost, True, optimal, bound, "milp")


def solve_exact(p: CoverProblem, time_limit_s: float = 1.0,
                max_dp_cells: int = DEFAULT_MAX_DP_CELLS) -> CoverSolution:
    """DP when (need in gcd units) x items is at most `max_dp_cells`, else the MILP."""
    if p.need <= 0 or p.total_size < p.need:
        return solve_dp(p)
    num_units = -(-p.need // math.gcd(*p.sizes))
    cells = len(p.chains) * (num_units + 1) ** 2 if p.parents else num_units * len(p.sizes)
    if cells <= max_dp_cells:
        return solve_dp(p)
    return solve_milp(p, time_limit_s)


def _ratio(p: CoverProblem, i: int) -> tuple[float, int]:
    return (p.costs[i] / p.sizes[i], i)


def greedy_by_ratio(p: CoverProblem) -> list[int]:
    """PERC's rule: repeatedly cut the cheapest-per-byte item that is a chain's current tail."""
    if p.need <= 0:
        return []
    below = [0] * len(p.chains)  # chains below g not yet cut whole
    for up in p.parents:
        if up >= 0:
            below[up] += 1
    left = {g: len(chain) for g, chain in enumerate(p.chains)}  # items still uncut per chain
    tails = {g for g in left if below[g] == 0}
    chosen: list[int] = []
    freed = 0
    while freed < p.need and tails:
        g = min(tails, key=lambda g: _ratio(p, p.chains[g][left[g] - 1]))  # unique keys
        item = p.chains[g][left[g] - 1]
        chosen.append(item)
        freed += p.sizes[item]
        left[g] -= 1
        if left[g] == 0:
            tails.discard(g)
            up = p.parents[g] if p.parents else -1
            if up >= 0:
                below[up] -= 1
                if below[up] == 0:
                    tails.add(up)
    return chosen


def greedy_plus_one(p: CoverProblem) -> list[int]:
    """Greedy by ratio that also tries finishing with the cheapest single covering item.

    Walk the ratio order keeping a partial set S that never covers (an item that would complete the
    cover is skipped); after every change of S, the candidate S + cheapest item j not in S with
    size_j >= need - size(S). Returns the cheapest candidate: cost <= 2 OPT (docs/perc_proof.md).
    One-item chains only (with longer chains the guarantee does not hold).
    """
    if any(len(c) != 1 for c in p.chains) or p.parents:
        raise ValueError("greedy_plus_one is defined for one-item chains (whole-session entries)")
    if p.need <= 0:
        return []
    if p.total_size < p.need:
        return list(range(len(p.sizes)))
    order = sorted(range(len(p.sizes)), key=lambda i: _ratio(p, i))
    in_s = [False] * len(order)
    partial: list[int] = []
    size = 0
    best: list[int] | None = None
    best_cost = math.inf
    for pos in range(len(order) + 1):
        if pos == 0 or (partial and partial[-1] == order[pos - 1]):
            rest = p.need - size
            cover = [j for j in range(len(order)) if not in_s[j] and p.sizes[j] >= rest]
            if cover:
                j = min(cover, key=lambda j: (p.costs[j], j))
                cost = p.cost_of(partial) + p.costs[j]
                if cost < best_cost:
                    best, best_cost = [*partial, j], cost
        if pos == len(order):
            break
        item = order[pos]
        if size + p.sizes[item] < p.need:
            partial.append(item)
            in_s[item] = True
            size += p.sizes[item]
    assert best is not None  # the empty S has a candidate once the total covers the need
    return best


def _lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Lower convex hull of points with increasing x (Andrew's monotone chain)."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while len(hull) >= 2:
            (ox, oy), (ax, ay) = hull[-2], hull[-1]
            if (ax - ox) * (p[1] - oy) - (ay - oy) * (p[0] - ox) > 0:
                break
            hull.pop()
        hull.append(p)
    return hull


def fractional_optimum(p: CoverProblem) -> float:
    """Optimum of the fractional relaxation with chain constraints (x_parent <= x_child).

    Per chain, the least cost of freeing F bytes is the lower convex hull of its tails' (bytes,
    cost) points; filling the need from all chains' hull segments in order of slope (cost per
    byte: the densest tail first) is optimal. With one-item chains this is section 1's ratio rule.
    """
    if p.parents:
        raise ValueError("fractional_optimum is defined for free-standing chains")
    if p.need <= 0:
        return 0.0
    segments: list[tuple[float, float, float]] = []  # (slope, bytes, cost)
    for chain in p.chains:
        points = [(0.0, 0.0)]
        for item in reversed(chain):
            points.append((points[-1][0] + p.sizes[item], points[-1][1] + p.costs[item]))
        hull = _lower_hull(points)
        for (x0, y0), (x1, y1) in zip(hull, hull[1:], strict=False):
            segments.append(((y1 - y0) / (x1 - x0), x1 - x0, y1 - y0))
    left, value = float(p.need), 0.0
    for slope, size, cost in sorted(segments):
        if left <= 0:
            break
        take = min(size, left)
        value += cost if take == size else slope * take
        left -= take
    return value if left <= 0 else math.inf
