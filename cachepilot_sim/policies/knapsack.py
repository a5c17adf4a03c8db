"""Choose-victims as a 0/1 covering knapsack: free at least `need` bytes at least total cost.

Items are grouped into ordered chains (root first); from a chain only a tail may be cut, so choosing
item j of a chain forces every item after j (prefix-sharing block chains: a shared prefix cannot go
before the blocks that extend it). Chains may hang below others (`parents`: a prefix tree cut into
chains at its branch points): a chain's items may go only once every chain below it is cut whole.
Whole-session eviction is the special case of one-item chains without parents.
Exact solvers: dynamic programming over size units (the gcd of the sizes) when the table is small,
`scipy.optimize.milp` (HiGHS) otherwise, with a time limit and the proven gap when it hits it.
Heuristics (greedy by cost/size, greedy plus one, the fractional bound): `knapsack_greedy.py`.
Pure functions; see docs/perc_proof.md for the statements and proofs.
"""

from __future__ import annotations

import math

import numpy as np

from cachepilot_sim.policies.cover_problem import CoverProblem, CoverSolution
from cachepilot_sim.policies.knapsack_greedy import greedy_by_ratio

__all__ = ["CoverProblem", "CoverSolution", "solve_dp", "solve_exact", "solve_milp"]

# A DP table larger than this (need units x items) goes to the MILP instead.
DEFAULT_MAX_DP_CELLS = 4_000_000


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
            tail = p.chains[g][len(p.chains[g]) - k :]
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
            out.extend(p.chains[g][len(p.chains[g]) - k :])
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
    res = milp(
        np.array(p.costs),
        constraints=constraints,
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9},
    )
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


def solve_exact(
    p: CoverProblem, time_limit_s: float = 1.0, max_dp_cells: int = DEFAULT_MAX_DP_CELLS
) -> CoverSolution:
    """DP when (need in gcd units) x items is at most `max_dp_cells`, else the MILP."""
    if p.need <= 0 or p.total_size < p.need:
        return solve_dp(p)
    num_units = -(-p.need // math.gcd(*p.sizes))
    cells = len(p.chains) * (num_units + 1) ** 2 if p.parents else num_units * len(p.sizes)
    if cells <= max_dp_cells:
        return solve_dp(p)
    return solve_milp(p, time_limit_s)
