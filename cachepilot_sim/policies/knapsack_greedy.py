"""Heuristics and the fractional bound for the covering knapsack of `knapsack.py`.

Greedy by cost/size (PERC's rule), greedy plus one covering item (a 2-approximation), and the
fractional optimum (the LP relaxation's value, which greedy by ratio attains). Pure functions;
docs/perc_proof.md states and proves them.
"""

from __future__ import annotations

import math

from cachepilot_sim.policies.cover_problem import CoverProblem


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
