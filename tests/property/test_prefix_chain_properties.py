"""Every policy on prefix chains (a forest of chains): only tails are cut, a branch only after the
chains below it, the bytes asked are freed or every candidate is taken, and the exact oracle never
costs more than any policy on the same decision. The forest DP equals brute force and the MILP."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, known_policies, make_policy
from cachepilot_sim.policies.knapsack import CoverProblem, solve_dp, solve_milp
from cachepilot_sim.policies.oracle import expected_costs

NOW = 10**11
BLOCK = 64 * 1024 * 1024

Forest = tuple[list[CacheEntry], list[list[int]], list[int], int]


@st.composite
def forests(draw: st.DrawFn, equal_sizes: bool = False) -> Forest:
    """Chains of 1-3 items; chain g hangs below a later chain or none (so no cycles)."""
    num_chains = draw(st.integers(1, 5))
    chains: list[list[int]] = []
    entries: list[CacheEntry] = []
    for _ in range(num_chains):
        chain = []
        for _ in range(draw(st.integers(1, 3))):
            i = len(entries)
            chain.append(i)
            entries.append(
                CacheEntry(
                    entry_id=100 + i,
                    session_id=draw(st.integers(0, 3)),
                    model_index=0,
                    class_index=draw(st.integers(0, 1)),
                    priority=draw(st.integers(0, 3)),
                    num_tokens=512,
                    num_bytes=BLOCK * (1 if equal_sizes else draw(st.integers(1, 4))),
                    created_us=draw(st.integers(0, NOW)),
                    last_used_us=draw(st.integers(0, NOW)),
                    num_uses=draw(st.integers(1, 6)),
                    gap_ema_us=draw(st.sampled_from([-1.0, 1e6, 2e7, 3e8])),
                    recompute_us=draw(st.floats(1.0, 1e6)),
                    reload_us=draw(st.floats(1.0, 1e5)),
                    restore_us=draw(st.floats(1.0, 1e6)),
                )
            )
        chains.append(chain)
    parents = [draw(st.sampled_from([-1, *range(g + 1, num_chains)])) for g in range(num_chains)]
    need = draw(st.integers(1, BLOCK * (4 * len(entries) + 2)))
    return entries, chains, parents, need


def fresh(name: str) -> tuple[object, GapEstimator]:
    cfg = policy_config(name)
    est = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
    return make_policy(cfg, est), est


def positions(entries: list[CacheEntry], victims: list[CacheEntry]) -> list[int]:
    index = {e.entry_id: i for i, e in enumerate(entries)}
    return [index[v.entry_id] for v in victims]


@settings(max_examples=60, deadline=None)
@given(forests())
def test_every_policy_cuts_only_tails_and_frees_the_bytes_or_takes_everything(case: Forest) -> None:
    entries, chains, parents, need = case
    shape = CoverProblem.of([1] * len(entries), [0.0] * len(entries), 0, chains, parents)
    for name in known_policies():
        policy, _ = fresh(name)
        chosen = positions(
            entries,
            policy.select_victims(  # type: ignore[attr-defined]
                entries, need, NOW, chains, parents
            ),
        )
        assert len(chosen) == len(set(chosen)), name
        assert shape.is_feasible_set(chosen), (name, chosen)
        freed = sum(entries[i].num_bytes for i in chosen)
        assert freed >= need or len(chosen) == len(entries), name


@settings(max_examples=60, deadline=None)
@given(forests())
def test_oracle_never_costs_more_than_any_policy_on_the_same_chained_decision(case: Forest) -> None:
    entries, chains, parents, need = case
    oracle, est = fresh("oracle")
    costs = expected_costs(est, entries, NOW)
    best = positions(
        entries,
        oracle.select_victims(  # type: ignore[attr-defined]
            entries, need, NOW, chains, parents
        ),
    )
    total = sum(e.num_bytes for e in entries)
    assert sum(entries[i].num_bytes for i in best) >= min(need, total)
    best_cost = float(costs[best].sum()) if best else 0.0
    for name in known_policies():
        policy, _ = fresh(name)
        chosen = positions(
            entries,
            policy.select_victims(  # type: ignore[attr-defined]
                entries, need, NOW, chains, parents
            ),
        )
        if sum(entries[i].num_bytes for i in chosen) >= min(need, total):
            paid = float(costs[chosen].sum()) if chosen else 0.0
            assert best_cost <= paid * (1 + 1e-9) + 1e-9, name


def brute_force(p: CoverProblem) -> float:
    best = float("inf")
    n = len(p.sizes)
    for r in range(n + 1):
        for subset in itertools.combinations(range(n), r):
            if p.size_of(subset) >= p.need and p.is_feasible_set(subset):
                best = min(best, p.cost_of(subset))
    return best


@settings(max_examples=60, deadline=None)
@given(forests(), st.data())
def test_forest_dp_equals_brute_force_and_the_milp(case: Forest, data: st.DataObject) -> None:
    entries, chains, parents, need = case
    costs = data.draw(st.lists(st.floats(0.0, 100.0), min_size=len(entries), max_size=len(entries)))
    p = CoverProblem.of([e.num_bytes for e in entries], costs, need, chains, parents)
    dp = solve_dp(p)
    assert p.is_feasible_set(dp.chosen)
    if p.total_size < p.need:
        assert len(dp.chosen) == len(entries) and not dp.covers
        return
    assert p.size_of(dp.chosen) >= p.need
    exact = brute_force(p)
    assert abs(dp.cost - exact) <= 1e-6 * max(1.0, exact)
    milp = solve_milp(p, time_limit_s=5.0)
    assert p.is_feasible_set(milp.chosen) and abs(milp.cost - exact) <= 1e-6 * max(1.0, exact)


def test_a_branch_goes_only_after_every_chain_below_it() -> None:
    # Root chain [0] (cost 0) with two chains below it, [1] and [2] (cost 50 each), and a lone
    # block [3] (cost 10); all one unit. Need 1: the root is the cheapest block but is no tail.
    p = CoverProblem.of(
        [1, 1, 1, 1], [0.0, 50.0, 50.0, 10.0], 1, [[0], [1], [2], [3]], [-1, 0, 0, -1]
    )
    assert solve_dp(p).chosen == (3,)
    assert not p.is_feasible_set([0]) and not p.is_feasible_set([0, 1])
    assert p.is_feasible_set([0, 1, 2])
    p3 = CoverProblem.of(p.sizes, p.costs, 3, p.chains, p.parents)
    assert solve_dp(p3).chosen == (0, 1, 2) and solve_dp(p3).cost == 100.0  # not 1, 2, 3: 110
