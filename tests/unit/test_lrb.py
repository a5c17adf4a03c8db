"""LRB-style relaxed Belady: entries predicted to come back beyond the boundary go first, the
predictor is learned from the gaps the run observed, conditioned on the time already idle."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.lrb import GapModel, LrbPolicy

S = 1_000_000


def make_lrb(**values: float) -> LrbPolicy:
    cfg = policy_config("lrb", **values)
    policy = make_policy(cfg, GapEstimator(0.3, 1e6, 1e6))
    assert isinstance(policy, LrbPolicy)
    return policy


def entry(eid: int, class_index: int, last_used_us: int) -> CacheEntry:
    return CacheEntry(eid, eid, 0, class_index, 0, 16, 4096, 0, last_used_us)


def train(policy: LrbPolicy, class_index: int, gaps_s: list[float], first_id: int) -> None:
    """Sessions of `class_index` that went idle and came back after each gap."""
    for i, gap in enumerate(gaps_s):
        e = entry(first_id + i, class_index, 0)
        policy.on_release(e, 0)
        policy.on_access(e, int(gap * S))


def test_entries_predicted_beyond_the_boundary_go_first() -> None:
    """Class 1 comes back after ~100 s, class 0 after ~1 s: with a 30 s boundary an idle class-1
    session goes before class-0 sessions idle longer (which LRU would take first)."""
    policy = make_lrb(lrb_boundary_s=30.0, lrb_min_gaps=4)
    train(policy, 0, [0.5, 1.0, 1.5, 2.0, 60.0], 1000)
    train(policy, 1, [90.0, 100.0, 110.0, 120.0], 2000)
    now = 10 * S
    short = [entry(i, 0, now - S // 2) for i in range(3)]  # idle 0.5 s, back in ~1 s
    far = entry(10, 1, now - S // 10)  # idle 0.1 s, back in ~100 s
    for e in [*short, far]:
        policy.on_release(e, e.last_used_us)
    victims = policy.select_victims([*short, far], 4096, now)
    assert [v.entry_id for v in victims] == [10]
    assert policy.predicted_residual_us(far, now) > 30 * S
    assert policy.predicted_residual_us(short[0], now) < 30 * S


def test_within_the_boundary_the_furthest_predicted_goes_first() -> None:
    policy = make_lrb(lrb_boundary_s=1000.0, lrb_min_gaps=2)
    train(policy, 0, [1.0, 2.0, 3.0], 1000)
    train(policy, 1, [10.0, 20.0, 30.0], 2000)
    now = 100 * S
    a, b = entry(1, 0, now), entry(2, 1, now)
    for e in (a, b):
        policy.on_release(e, now)
    assert [e.entry_id for e in policy.order([a, b], now)] == [2, 1]


def test_an_entry_idle_past_every_observed_gap_is_beyond_any_boundary() -> None:
    """The prediction is conditioned on the idle time: a gap longer than all seen is unknown."""
    policy = make_lrb(lrb_boundary_s=30.0, lrb_min_gaps=1)
    train(policy, 0, [1.0, 5.0, 20.0], 1000)
    e = entry(1, 0, 0)
    policy.on_release(e, 0)
    assert policy.predicted_residual_us(e, 10 * S) == 10 * S  # the one longer gap, 20 s, left
    assert math.isinf(policy.predicted_residual_us(e, 25 * S))
    assert policy.key(e, 25 * S)[0] == 0


def test_the_window_forgets_old_gaps() -> None:
    model = GapModel(window=8, min_gaps=1)
    for _ in range(8):
        model.observe((0, 1, -1), 100 * S)
    assert model.residual_us((0, 1, -1), 0) == 100 * S
    for _ in range(8):
        model.observe((0, 1, -1), S)
    assert model.residual_us((0, 1, -1), 0) == S


def test_a_sparse_bucket_borrows_the_population() -> None:
    model = GapModel(window=64, min_gaps=4)
    model.observe((0, 1, -1), 7 * S)
    for _ in range(5):
        model.observe((1, 1, -1), S)
    # Bucket (0,1,-1) has one gap: the population's median (1 s) answers.
    assert model.residual_us((0, 1, -1), 0) == S


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 200)), min_size=1, max_size=60),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 300)), min_size=1, max_size=30),
    st.integers(1, 100),
)
def test_the_order_puts_every_entry_beyond_the_boundary_first(
    gaps: list[tuple[int, int]], idle: list[tuple[int, int]], boundary_s: int
) -> None:
    policy = make_lrb(lrb_boundary_s=float(boundary_s), lrb_min_gaps=1)
    for i, (c, gap) in enumerate(gaps):
        train(policy, c, [float(gap)], 10_000 + i)
    now = 1000 * S
    entries = [entry(i, c, now - t * S) for i, (c, t) in enumerate(idle)]
    for e in entries:
        policy.on_release(e, e.last_used_us)
    beyond = [
        policy.predicted_residual_us(e, now) > boundary_s * S for e in policy.order(entries, now)
    ]
    assert beyond == sorted(beyond, reverse=True)
    assert policy.metrics()["lrb_gaps_observed"] == len(gaps)
