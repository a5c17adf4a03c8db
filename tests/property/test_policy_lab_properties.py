"""Hypothesis properties of every registered policy: free the bytes asked, never beat the oracle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, known_policies, make_policy
from cachepilot_sim.policies.oracle import OraclePolicy, expected_costs

NOW = 10**11
BLOCK = 2 * 1024 * 1024


@st.composite
def decisions(draw: st.DrawFn) -> tuple[list[CacheEntry], int]:
    n = draw(st.integers(min_value=1, max_value=8))
    entries = []
    for i in range(n):
        entries.append(
            CacheEntry(
                entry_id=i,
                session_id=i,
                model_index=0,
                class_index=draw(st.integers(0, 2)),
                priority=draw(st.integers(0, 3)),
                num_tokens=16,
                num_bytes=BLOCK * draw(st.integers(1, 50)),
                created_us=draw(st.integers(0, NOW)),
                last_used_us=draw(st.integers(0, NOW)),
                num_uses=draw(st.integers(1, 6)),
                gap_ema_us=draw(st.sampled_from([-1.0, 1e6, 2e7, 3e8])),
                recompute_us=draw(st.floats(1.0, 1e6)),
                reload_us=draw(st.floats(1.0, 1e5)),
                restore_us=draw(st.floats(1.0, 1e6)),
                next_arrival_us=draw(st.sampled_from([-1, NOW + 10**6, NOW + 10**9])),
            )
        )
    need = draw(st.integers(min_value=1, max_value=BLOCK * 60 * n))
    return entries, need


def fresh(name: str) -> tuple[object, GapEstimator]:
    cfg = policy_config(name)
    est = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
    return make_policy(cfg, est), est


@settings(max_examples=40, deadline=None)
@given(decisions())
def test_every_policy_frees_the_bytes_asked_or_takes_every_candidate(
    case: tuple[list[CacheEntry], int],
) -> None:
    entries, need = case
    for name in known_policies():
        policy, _ = fresh(name)
        victims = policy.select_victims(entries, need, NOW)  # type: ignore[attr-defined]
        ids = [v.entry_id for v in victims]
        assert len(ids) == len(set(ids)), name
        freed = sum(v.num_bytes for v in victims)
        assert freed >= need or len(victims) == len(entries), name


@settings(max_examples=40, deadline=None)
@given(decisions())
def test_oracle_never_costs_more_than_any_policy_on_the_same_decision(
    case: tuple[list[CacheEntry], int],
) -> None:
    entries, need = case
    total = sum(e.num_bytes for e in entries)
    oracle, est = fresh("oracle")
    assert isinstance(oracle, OraclePolicy)
    costs = dict(zip((e.entry_id for e in entries), expected_costs(est, entries, NOW), strict=True))
    best = sum(costs[v.entry_id] for v in oracle.select_victims(entries, need, NOW))
    for name in known_policies():
        policy, _ = fresh(name)
        victims = policy.select_victims(entries, need, NOW)  # type: ignore[attr-defined]
        if sum(v.num_bytes for v in victims) >= min(need, total):
            paid = sum(costs[v.entry_id] for v in victims)
            assert best <= paid * (1 + 1e-9) + 1e-9, name
