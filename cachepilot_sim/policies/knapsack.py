"""Choose-victims as a 0/1 covering knapsack: free at least `need` bytes at least total cost.

Items are grouped into ordered chains (root first); from a chain only a tail may be cut, so choosing
item j of a chain forces every item after j (prefix-sharing block chains: a shared prefix cannot go
before the blocks that extend it). Whole-session eviction is the special case of one-item chains.
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
    """Sizes (bytes, > 0) and costs (>= 0) per item; chains partition the items, root first."""

    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    need: int
    chains: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(sizes: Sequence[int], costs: Sequence[float], need: int,
           chains: Sequence[Sequence[int]] | None = None) -> CoverProblem:
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
        return CoverProblem(tuple(int(s) for s in sizes), tuple(float(c) for c in costs),
                            int(need), groups)

    @property
    def total_size(self) -> int:
        return sum(self.sizes)

    def is_feasible_set(self, chosen: Sequence[int]) -> bool:
        """True when `chosen` respects the chains (each chain's chosen items form a tail)."""
        picked = set(chosen)
        for chain in self.chains:
            flags = [i in picked for i in chain]
            if any(flags) and not all(flags[flags.index(True):]):
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
    if num_units * len(p.sizes) <= max_dp_cells:
        return solve_dp(p)
    return solve_milp(p, time_limit_s)


def _ratio(p: CoverProblem, i: int) -> tuple[float, int]:
    return (p.costs[i] / p.sizes[i], i)


def greedy_by_ratio(p: CoverProblem) -> list[int]:
    """PERC's rule: repeatedly cut the cheapest-per-byte item that is a chain's current tail."""
    if p.need <= 0:
        return []
    tails = {g: len(chain) for g, chain in enumerate(p.chains)}  # items still uncut per chain
    chosen: list[int] = []
    freed = 0
    while freed < p.need and tails:
        g = min(tails, key=lambda g: _ratio(p, p.chains[g][tails[g] - 1]))
        item = p.chains[g][tails[g] - 1]
        chosen.append(item)
        freed += p.sizes[item]
        tails[g] -= 1
        if tails[g] == 0:
            del tails[g]
    return chosen


def greedy_plus_one(p: CoverProblem) -> list[int]:
    """Greedy by ratio that also tries finishing with the cheapest single covering item.

    Walk the ratio order keeping a partial set S that never covers (an item that would complete the
    cover is skipped); after every change of S, the candidate S + cheapest item j not in S with
    size_j >= need - size(S). Returns the cheapest candidate: cost <= 2 OPT (docs/perc_proof.md).
    One-item chains only (with longer chains the guarantee does not hold).
    """
    if any(len(c) != 1 for c in p.chains):
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
