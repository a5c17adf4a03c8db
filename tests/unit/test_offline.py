"""Offline bounds: Belady's MIN is optimal for unit sizes, the LP never exceeds what was paid."""

from __future__ import annotations

import itertools
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.experiment.offline import (
    AccessSequence,
    IdleGap,
    access_sequence,
    belady_misses,
    integral_optimum,
    lp_lower_bound,
)
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config

accesses_st = st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=11)


def optimal_paging_misses(accesses: list[int], capacity: int) -> int:
    """Brute force over every eviction choice (demand paging)."""

    @cache
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(accesses):
            return 0
        item = accesses[i]
        if item in cache:
            return best(i + 1, cache)
        if len(cache) < capacity:
            return 1 + best(i + 1, cache | {item})
        return 1 + min(best(i + 1, (cache - {v}) | {item}) for v in cache)

    return best(0, frozenset())


@given(accesses_st, st.integers(min_value=1, max_value=3))
def test_belady_min_equals_brute_force_optimum(accesses: list[int], capacity: int) -> None:
    assert belady_misses(accesses, capacity) == optimal_paging_misses(accesses, capacity)


def uniform_sequence(accesses: list[int], capacity: int) -> AccessSequence:
    """Access i occupies one slot during [i, i+1); the idle gap until its next access costs 1."""
    running = tuple((i, i + 1, 1) for i in range(len(accesses)))
    gaps = []
    for i, item in enumerate(accesses):
        nxt = next((j for j in range(i + 1, len(accesses)) if accesses[j] == item), None)
        if nxt is not None:
            gaps.append(IdleGap(i + 1, nxt, 1, 1.0))
    return AccessSequence(running, tuple(gaps), capacity)


@settings(deadline=None, max_examples=60)
@given(accesses_st, st.integers(min_value=1, max_value=3))
def test_lp_bound_never_exceeds_belady_on_unit_sizes_and_costs(
    accesses: list[int], capacity: int
) -> None:
    compulsory = len(set(accesses))
    bound = lp_lower_bound(uniform_sequence(accesses, capacity))
    assert 0.0 <= bound.restore_us <= belady_misses(accesses, capacity) - compulsory + 1e-7
    assert bound.restore_us <= bound.never_kept_us + 1e-9


@settings(deadline=None, max_examples=40)
@given(accesses_st, st.integers(min_value=1, max_value=3))
def test_integral_offline_optimum_equals_belady_on_unit_sizes_and_costs(
    accesses: list[int], capacity: int
) -> None:
    opt = integral_optimum(uniform_sequence(accesses, capacity))
    assert opt.optimal
    assert opt.restore_us == belady_misses(accesses, capacity) - len(set(accesses))


def test_lp_bound_is_zero_with_room_and_everything_with_none() -> None:
    accesses = [0, 1, 2, 0, 1, 2, 0]
    roomy = lp_lower_bound(uniform_sequence(accesses, capacity=10))
    assert roomy.restore_us == pytest.approx(0.0, abs=1e-9)
    tight = lp_lower_bound(uniform_sequence(accesses, capacity=1))
    assert tight.restore_us == pytest.approx(tight.never_kept_us) and tight.never_kept_us == 4


@pytest.mark.parametrize("policy", ["lru", "perc"])
def test_lp_bound_never_exceeds_the_restore_cost_a_run_paid(policy: str) -> None:
    cfg = make_sim_config(policy=policy_config(policy))
    result = build(cfg).run()
    seq = access_sequence(cfg, result.requests)
    bound = lp_lower_bound(seq)
    assert bound.num_gaps > 0 and bound.restore_us > 0  # the pool is under pressure
    assert bound.restore_us / 1e6 <= result.metrics["realized_restore_s"] + 1e-9
    assert bound.restore_us <= bound.never_kept_us


def test_integral_optimum_lies_between_the_lp_bound_and_what_the_run_paid() -> None:
    cfg = make_sim_config(policy=policy_config("lru"))
    result = build(cfg).run()
    seq = access_sequence(cfg, result.requests)
    lp, opt = lp_lower_bound(seq), integral_optimum(seq, time_limit_s=20.0)
    assert lp.restore_us <= opt.bound_us * (1 + 1e-6) + 1e-6
    assert opt.bound_us <= opt.restore_us <= result.metrics["realized_restore_s"] * 1e6 + 1e-6


def test_brute_force_counts_only_first_accesses_when_everything_fits() -> None:
    # Guard the brute force itself: with capacity >= distinct items only first accesses miss.
    for accesses in itertools.product(range(3), repeat=5):
        assert optimal_paging_misses(list(accesses), 3) == len(set(accesses))
