"""Hypothesis properties of the choose-victims knapsack: exact solvers, greedy, greedy+1."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.policies.knapsack import CoverProblem, solve_dp, solve_exact, solve_milp
from cachepilot_sim.policies.knapsack_greedy import (
    fractional_optimum,
    greedy_by_ratio,
    greedy_plus_one,
)

TOL = 1e-7

sizes_st = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=9)


@st.composite
def problems(draw: st.DrawFn, chained: bool = False, equal_sizes: bool = False) -> CoverProblem:
    sizes = draw(sizes_st)
    n = len(sizes)
    if equal_sizes:
        sizes = [sizes[0]] * n
    costs = draw(
        st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), min_size=n, max_size=n)
    )
    need = draw(st.integers(min_value=0, max_value=sum(sizes)))
    chains: list[list[int]] = [[i] for i in range(n)]
    if chained:
        perm = draw(st.permutations(list(range(n))))
        cuts = sorted(
            draw(st.sets(st.integers(min_value=1, max_value=max(n - 1, 1)), max_size=n - 1))
        )
        bounds = [0, *[c for c in cuts if c < n], n]
        chains = [list(perm[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return CoverProblem.of(sizes, costs, need, chains)


@st.composite
def greedy_traps(draw: st.DrawFn) -> CoverProblem:
    """The issue's counter-example family (a: B-1 bytes, cost 1; b: B bytes, cost ~2B; c: 1 byte,
    cost 2) with jitter and a few random items, where greedy by ratio is usually far from OPT."""
    big = draw(st.integers(min_value=3, max_value=200))
    jitter = draw(st.floats(min_value=0.0, max_value=0.5))
    sizes = [big - 1, big, 1]
    costs = [1.0, 2.0 * big - 1 - jitter, 2.0]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        sizes.append(draw(st.integers(min_value=1, max_value=2 * big)))
        costs.append(draw(st.floats(min_value=0, max_value=4.0 * big, allow_nan=False)))
    return CoverProblem.of(sizes, costs, big)


def brute_force(p: CoverProblem) -> float:
    best = float("inf")
    n = len(p.sizes)
    for r in range(n + 1):
        for combo in itertools.combinations(range(n), r):
            if p.size_of(combo) >= p.need and p.is_feasible_set(combo):
                best = min(best, p.cost_of(combo))
    return best


def close_le(a: float, b: float) -> bool:
    return a <= b + TOL * max(1.0, abs(b))


@given(problems(chained=True))
def test_dp_equals_brute_force_with_chains(p: CoverProblem) -> None:
    sol = solve_dp(p)
    assert sol.covers and sol.optimal
    assert p.size_of(sol.chosen) >= p.need and p.is_feasible_set(sol.chosen)
    assert abs(sol.cost - brute_force(p)) <= TOL * max(1.0, sol.cost)


@settings(max_examples=60, deadline=None)
@given(problems(chained=True))
def test_dp_and_milp_agree(p: CoverProblem) -> None:
    dp, mip = solve_dp(p), solve_milp(p, time_limit_s=5.0)
    assert mip.optimal and p.is_feasible_set(mip.chosen) and p.size_of(mip.chosen) >= p.need
    assert abs(dp.cost - mip.cost) <= 1e-6 * max(1.0, dp.cost)


@given(problems(equal_sizes=True))
def test_greedy_by_ratio_is_optimal_when_sizes_are_equal(p: CoverProblem) -> None:
    greedy = greedy_by_ratio(p)
    assert p.size_of(greedy) >= p.need
    assert abs(p.cost_of(greedy) - solve_dp(p).cost) <= TOL * max(1.0, p.cost_of(greedy))


@given(problems())
def test_greedy_costs_at_most_opt_plus_the_largest_single_cost(p: CoverProblem) -> None:
    greedy = greedy_by_ratio(p)
    assert p.size_of(greedy) >= p.need
    assert close_le(p.cost_of(greedy), solve_dp(p).cost + max(p.costs))


@given(st.one_of(problems(), greedy_traps()))
def test_perc_plus_one_is_a_two_approximation_and_never_worse_than_greedy(p: CoverProblem) -> None:
    plus = greedy_plus_one(p)
    opt = solve_dp(p).cost
    assert p.size_of(plus) >= p.need
    assert close_le(p.cost_of(plus), 2 * opt)
    assert close_le(p.cost_of(plus), p.cost_of(greedy_by_ratio(p)))


@given(problems(chained=True))
def test_chain_aware_greedy_only_cuts_tails(p: CoverProblem) -> None:
    greedy = greedy_by_ratio(p)
    assert p.is_feasible_set(greedy) and p.size_of(greedy) >= p.need
    assert close_le(solve_exact(p).cost, p.cost_of(greedy))


def test_issue_counter_example_greedy_pays_2b_and_the_optimum_3() -> None:
    big = 1000
    p = CoverProblem.of([big - 1, big, 1], [1.0, 2.0 * big - 1, 2.0], big)
    assert sorted(greedy_by_ratio(p)) == [0, 1] and p.cost_of(greedy_by_ratio(p)) == 2 * big
    sol = solve_exact(p)
    assert sol.chosen == (0, 2) and sol.cost == 3.0
    assert p.cost_of(greedy_plus_one(p)) == 3.0


def test_chains_make_ratio_order_suboptimal_even_with_equal_sizes() -> None:
    # Chain [a, b]: a (cost 0) can only go with its tail b (cost 10); c costs 5. Need 2 units.
    p = CoverProblem.of([1, 1, 1], [0.0, 10.0, 5.0], 2, chains=[[0, 1], [2]])
    assert p.cost_of(greedy_by_ratio(p)) == 15.0
    assert solve_exact(p).cost == 10.0 and not p.is_feasible_set([0, 2])


def test_milp_reports_gap_and_stays_feasible_when_the_time_limit_hits() -> None:
    sizes = [1000 + (i * 7919) % 997 for i in range(60)]
    costs = [float((i * 104729) % 1009 + 1) for i in range(60)]
    p = CoverProblem.of(sizes, costs, sum(sizes) // 2)
    opt = solve_dp(p).cost
    sol = solve_milp(p, time_limit_s=1e-3)
    assert sol.covers and p.size_of(sol.chosen) >= p.need
    assert sol.bound <= opt + 1e-6 <= sol.cost + 2e-6  # a proven bound below a feasible cost
    assert sol.gap == 0.0 if sol.optimal else sol.gap >= 0.0


def test_exact_solver_uses_the_milp_when_the_dp_table_would_be_too_large() -> None:
    p = CoverProblem.of([3, 5, 7], [1.0, 2.0, 2.5], 9)
    assert solve_exact(p).method == "dp"
    big = solve_exact(p, max_dp_cells=1)
    assert big.method == "milp" and big.cost == solve_dp(p).cost == 3.5


@settings(max_examples=60, deadline=None)
@given(problems(chained=True))
def test_densest_tail_rule_is_the_fractional_optimum_with_chains(p: CoverProblem) -> None:
    import numpy as np
    from scipy.optimize import linprog

    n = len(p.sizes)
    rows = []
    for chain in p.chains:  # x[parent] - x[child] <= 0
        for parent, child in zip(chain, chain[1:], strict=False):
            row = np.zeros(n)
            row[parent], row[child] = 1.0, -1.0
            rows.append(row)
    a_ub = np.vstack([-np.array(p.sizes, dtype=float), *rows])
    b_ub = np.concatenate([[-float(p.need)], np.zeros(len(rows))])
    res = linprog(np.array(p.costs), A_ub=a_ub, b_ub=b_ub, bounds=(0, 1), method="highs")
    assert res.status == 0
    value = fractional_optimum(p)
    assert abs(value - res.fun) <= 1e-6 * max(1.0, abs(res.fun))
    assert close_le(value, solve_dp(p).cost)  # a relaxation: never above the 0/1 optimum
