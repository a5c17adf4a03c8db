"""The Wild policy's reuse probability is a probability for every count of releases and returns
(issue 15): a class that counted more returns than releases (an entry used again before its turn
ended) made q = (returns + 1) / (releases + 2) exceed 1, and 1 - q + q e^{-rt} reached 0 (division
by zero) or went negative (a negative "probability" ranking the entry first)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.utility import WildPolicy


def _entry(last_used_us: int) -> CacheEntry:
    return CacheEntry(
        entry_id=1, session_id=1, model_index=0, class_index=0, priority=1, num_tokens=16,
        num_bytes=16 * 131072, created_us=0, last_used_us=last_used_us,
    )  # fmt: skip


def _wild() -> WildPolicy:
    cfg = policy_config("wild")
    policy = make_policy(
        cfg, GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
    )
    assert isinstance(policy, WildPolicy)
    return policy


def test_more_returns_than_releases_no_longer_divides_by_zero() -> None:
    """The failing case of the old code: 3 returns, no release, mean gap 1 s, idle ln 2 s: q = 2,
    alive = 2 e^{-ln 2} = 1, denominator 1 - 2 + 1 = 0."""
    wild = _wild()
    returner = _entry(0)
    for _ in range(3):
        wild.on_access(returner, 1_000_000)  # each adds a gap of 1 s
        returner.last_used_us = 0
    idle_us = round(math.log(2) * 1e6)
    p = wild.reuse_probability(_entry(0), idle_us)
    assert 0.0 <= p <= 1.0


@settings(max_examples=200, deadline=None)
@given(
    releases=st.integers(0, 50),
    returns=st.integers(0, 200),
    gap_us=st.integers(0, 10**9),
    idle_us=st.integers(0, 10**10),
)
def test_reuse_probability_is_a_probability(
    releases: int, returns: int, gap_us: int, idle_us: int
) -> None:
    wild = _wild()
    entry = _entry(0)
    for _ in range(releases):
        wild.on_release(entry, 0)
    for _ in range(returns):
        entry.last_used_us = 0
        wild.on_access(entry, gap_us)
    p = wild.reuse_probability(_entry(0), idle_us)
    assert math.isfinite(p) and 0.0 <= p <= 1.0
    # Idle longer is never more likely to return within delta (the exponential model's decay).
    assert wild.reuse_probability(_entry(0), idle_us + 10**6) <= p + 1e-12
