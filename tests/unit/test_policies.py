from __future__ import annotations

import pytest

from cachepilot_sim.config import PolicyConfig, policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy, register
from cachepilot_sim.policies.base import RankingPolicy


def make_entry(entry_id: int, **overrides: object) -> CacheEntry:
    values: dict[str, object] = dict(
        entry_id=entry_id,
        session_id=entry_id,
        model_index=0,
        class_index=0,
        priority=1,
        num_tokens=1024,
        num_bytes=1024 * 131072,
        created_us=0,
        last_used_us=0,
        recompute_us=30_000.0,
        reload_us=2_500.0,
        restore_us=2_500.0,
    )
    values.update(overrides)
    return CacheEntry(**values)  # type: ignore[arg-type]


def make(name: str, **kw: float) -> RankingPolicy:
    cfg = policy_config(name, **kw)
    est = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
    policy = make_policy(cfg, est)
    assert isinstance(policy, RankingPolicy)
    return policy


def test_unknown_policy_name_is_a_value_error_listing_known_names() -> None:
    cfg = PolicyConfig()
    object.__setattr__(cfg, "name", "nope")
    with pytest.raises(ValueError, match=r"unknown eviction policy 'nope'; known: \["):
        make_policy(cfg, GapEstimator(0.3, 1.0, 1.0))


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("lru")(RankingPolicy)  # type: ignore[arg-type]


def test_lru_evicts_least_recently_used_first() -> None:
    lru = make("lru")
    entries = [
        make_entry(0, last_used_us=50),
        make_entry(1, last_used_us=10),
        make_entry(2, last_used_us=30),
    ]
    victims = lru.select_victims(entries, bytes_needed=1, now_us=100)
    assert [v.entry_id for v in victims] == [1]
    assert [e.entry_id for e in lru.order(entries, 100)] == [1, 2, 0]


def test_priority_evicts_lowest_priority_then_lru() -> None:
    prio = make("priority")
    entries = [
        make_entry(0, priority=2, last_used_us=1),
        make_entry(1, priority=0, last_used_us=9),
        make_entry(2, priority=0, last_used_us=5),
    ]
    assert [e.entry_id for e in prio.order(entries, 100)] == [2, 1, 0]


def test_select_victims_stops_once_enough_bytes_are_covered() -> None:
    lru = make("lru")
    entries = [make_entry(i, last_used_us=i, num_bytes=100) for i in range(10)]
    assert len(lru.select_victims(entries, 250, 100)) == 3
    assert lru.select_victims(entries, 0, 100) == []


def test_perc_evicts_dormant_session_before_active_one() -> None:
    perc = make("perc", delta_s=30.0)
    now = 1_000_000_000
    active = make_entry(0, gap_ema_us=5e6, last_used_us=now - 1_000_000)  # returns every ~5 s
    dormant = make_entry(1, gap_ema_us=5e6, last_used_us=now - 600_000_000)  # idle 10 minutes
    assert [e.entry_id for e in perc.order([active, dormant], now)] == [1, 0]


def test_perc_prefers_evicting_cheap_to_restore_bytes() -> None:
    perc = make("perc")
    cheap = make_entry(0, restore_us=1_000.0)
    dear = make_entry(1, restore_us=50_000.0)
    assert perc.select_victims([dear, cheap], 1, 0)[0].entry_id == 0


def test_perc_vectorised_order_equals_scalar_keys() -> None:
    perc = make("perc")
    entries = [
        make_entry(
            i,
            gap_ema_us=float((i * 7919) % 97) * 1e6 - 1e6,
            last_used_us=(i * 104729) % 1000,
            restore_us=float(1 + (i * 31) % 17),
            num_bytes=1 + (i * 13) % 5,
        )
        for i in range(100)
    ]
    scalar = sorted(entries, key=lambda e: perc.key(e, 5_000))
    assert [e.entry_id for e in perc.order(entries, 5_000)] == [e.entry_id for e in scalar]


def test_gap_estimator_uses_population_prior_until_a_gap_is_seen() -> None:
    est = GapEstimator(ema_weight=0.5, prior_gap_us=10e6, delta_us=10e6)
    e = make_entry(0, gap_ema_us=-1.0, last_used_us=0)
    assert est.gap_us(e, 0) == 10e6
    est.observe(e, 2_000_000)
    assert e.gap_ema_us == 2e6
    assert est.population_gap_us == pytest.approx(6e6)
    est.observe(e, 4_000_000)
    assert e.gap_ema_us == pytest.approx(3e6)
