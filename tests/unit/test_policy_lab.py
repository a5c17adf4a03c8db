"""Baseline policies follow their papers' rules; the shadow oracle scores a real run."""

from __future__ import annotations

import pytest

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.base import RankingPolicy
from cachepilot_sim.policies.classic import ArcPolicy, GdsfPolicy, SlruPolicy
from cachepilot_sim.policies.oracle import OraclePolicy
from cachepilot_sim.policies.perc_variants import PercHazardPolicy, SurvivalEstimate
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config
from tests.unit.test_policies import make_entry


def make(name: str, **kw: object) -> RankingPolicy:
    cfg = policy_config(name, **kw)  # type: ignore[arg-type]
    est = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
    policy = make_policy(cfg, est)
    assert isinstance(policy, RankingPolicy)
    return policy


def ids(entries: list[CacheEntry]) -> list[int]:
    return [e.entry_id for e in entries]


def evict(policy: RankingPolicy, entries: list[CacheEntry], need: int, now: int) -> None:
    """Select and evict, as a KV manager does: it reports every victim to `on_evict`."""
    for v in policy.select_victims(entries, need, now):
        policy.on_evict(v, now)


def test_fifo_evicts_in_order_of_entering_the_cache_not_of_use() -> None:
    fifo = make("fifo")
    a, b = (
        make_entry(0, created_us=10, last_used_us=900),
        make_entry(1, created_us=20, last_used_us=100),
    )
    for e in (a, b):
        fifo.on_release(e, e.last_used_us)
    assert ids(fifo.order([b, a], 1000)) == [0, 1]
    evict(fifo, [a, b], 1, 1000)  # a leaves; when it returns it re-enters last
    fifo.on_access(a, 2000)
    assert ids(fifo.order([a, b], 3000)) == [1, 0]


def test_lfu_evicts_fewest_uses_then_least_recent() -> None:
    lfu = make("lfu")
    entries = [
        make_entry(0, num_uses=3, last_used_us=1),
        make_entry(1, num_uses=1, last_used_us=50),
        make_entry(2, num_uses=1, last_used_us=40),
    ]
    assert ids(lfu.order(entries, 100)) == [2, 1, 0]


def test_slru_keeps_reused_entries_protected_and_demotes_overflow() -> None:
    slru = make("slru", slru_protected_fraction=0.5)
    assert isinstance(slru, SlruPolicy)
    entries = [make_entry(i, last_used_us=i, num_bytes=100) for i in range(4)]
    for e in entries[:3]:
        slru.on_access(e, 10)  # hits: 0, 1, 2 protected; room is half of 400 bytes = 2 entries
    # 0 is the least recent protected entry: demoted into probation, where it is older than 3.
    assert ids(slru.order(entries, 100)) == [0, 3, 1, 2]
    evict(slru, entries, 100, 100)
    slru.on_access(entries[0], 200)  # a miss: comes back probationary
    assert 0 not in slru.protected


def test_arc_ghost_hit_in_b1_raises_the_recency_target() -> None:
    arc = make("arc")
    assert isinstance(arc, ArcPolicy)
    entries = [make_entry(i, last_used_us=i, num_bytes=100) for i in range(4)]
    evict(arc, entries, 100, 10)  # evicts 0 from T1 into ghost B1
    assert 0 in arc.ghost1 and arc.target_bytes == 0
    arc.on_access(entries[0], 20)  # a returning victim: the target grows, it re-enters T1
    assert arc.target_bytes == 100 and 0 not in arc.frequent and 0 not in arc.ghost1
    arc.on_access(entries[3], 20)  # a hit on a resident entry promotes it to T2
    assert 3 in arc.frequent
    # T1 = {0, 1, 2} holds 300 bytes > p = 100: T1's LRU goes until T1 is down to p, then T2.
    assert ids(arc.order(entries, 30)) == [0, 1, 3, 2]
    arc.target_bytes = 1000.0  # once T1 is within its target, T2's LRU goes first
    assert ids(arc.order(entries, 30))[0] == 3


def test_gdsf_inflation_ages_entries_that_were_not_used_since() -> None:
    gdsf = make("gdsf")
    assert isinstance(gdsf, GdsfPolicy)
    old = make_entry(0, restore_us=1000.0, num_bytes=10)
    gdsf.on_release(old, 0)
    victim = make_entry(1, restore_us=5000.0, num_bytes=10)
    gdsf.on_release(victim, 0)
    evict(gdsf, [victim], 1, 1)
    assert gdsf.inflation == pytest.approx(500.0)
    fresh = make_entry(2, restore_us=1000.0, num_bytes=10)
    gdsf.on_release(fresh, 2)  # same cost and size as `old`, but its H starts from L = 500
    assert ids(gdsf.order([fresh, old], 3)) == [0, 2]


def test_marconi_prefers_keeping_flop_dense_recent_entries() -> None:
    marconi = make("marconi")
    cheap_old = make_entry(0, recompute_us=10.0, last_used_us=0)
    dense_new = make_entry(1, recompute_us=1e6, last_used_us=100)
    assert ids(marconi.order([dense_new, cheap_old], 200)) == [0, 1]


def test_wild_evicts_sessions_of_classes_that_rarely_return_first() -> None:
    wild = make("wild")
    returner, leaver = make_entry(0, class_index=0), make_entry(1, class_index=1)
    for _ in range(20):
        wild.on_release(make_entry(2, class_index=0), 0)
        wild.on_access(make_entry(2, class_index=0, last_used_us=0), 5_000_000)
        wild.on_release(make_entry(3, class_index=1), 0)
    assert ids(wild.order([returner, leaver], 1_000_000)) == [1, 0]


def test_survival_estimate_keeps_never_returning_sessions_as_censored() -> None:
    km = SurvivalEstimate(max_subjects=100)
    for i in range(10):
        km.release(i, 0)
    for i in range(5):
        km.returned(i, 10_000_000)  # half come back after exactly 10 s; half never
    times, surv = km.curve(now_us=100_000_000)
    assert times.tolist() == [10_000_000.0] and surv.tolist() == [0.5]


def test_perc_hazard_sees_no_resume_chance_past_a_fixed_think_time() -> None:
    hz = make("perc_hazard", delta_s=5.0)
    assert isinstance(hz, PercHazardPolicy)
    for i in range(10):
        e = make_entry(i, class_index=0, last_used_us=0)
        hz.on_release(e, 0)
        hz.on_access(e, 10_000_000)  # every gap is exactly 10 s
    soon = make_entry(20, class_index=0, last_used_us=12_000_000 - 7_000_000)  # idle 7 s
    late = make_entry(21, class_index=0, last_used_us=12_000_000 - 11_000_000)  # idle 11 s
    p = hz.probabilities([soon, late], 12_000_000)
    assert p[0] == pytest.approx(1.0) and p[1] == 0.0  # an exponential model would say ~0.22


def test_clairvoyant_evicts_sessions_that_never_return_then_the_latest_returning() -> None:
    cv = make("perc_clairvoyant", delta_s=10.0)
    never = make_entry(0, next_arrival_us=-1)
    soon = make_entry(1, next_arrival_us=5_000_000)
    late = make_entry(2, next_arrival_us=500_000_000)
    assert ids(cv.order([soon, late, never], 0)) == [0, 2, 1]


def run_shadowed(policy: str) -> dict[str, float]:
    cfg = make_sim_config(policy=policy_config(policy, shadow_oracle=True))
    return build(cfg).run().metrics


def test_shadow_oracle_scores_every_decision_and_finds_no_gap_for_the_oracle() -> None:
    perc, oracle = run_shadowed("perc"), run_shadowed("oracle")
    assert perc["shadow_decisions"] > 0 and oracle["shadow_decisions"] > 0
    assert oracle["oracle_gap_worst"] == pytest.approx(0.0, abs=1e-9)
    assert perc["oracle_gap_mean"] >= 0.0 and perc["shadow_short_decisions"] == 0
    assert perc["shadow_oracle_expected_s"] <= perc["shadow_policy_expected_s"] + 1e-9
    assert perc["realized_restore_s"] > 0  # the run still reports what was actually paid


def test_shadowed_perc_plus1_stays_within_twice_the_oracle_on_every_decision() -> None:
    m = run_shadowed("perc_plus1")
    assert m["shadow_decisions"] > 0 and m["oracle_gap_worst"] <= 1.0 + 1e-9


def test_shadow_does_not_change_the_policy_decisions() -> None:
    plain = build(make_sim_config(policy=policy_config("lru"))).run().metrics
    shadowed = run_shadowed("lru")
    for key in ("realized_restore_s", "evictions", "ttft_p99_s", "completed"):
        assert plain[key] == shadowed[key], key


def test_tlru_evicts_kv_that_cannot_breach_the_tail_target_first() -> None:
    tlru = make("tlru", tlru_threshold_ms=100.0)
    cheap_recent = make_entry(0, restore_us=50_000.0, last_used_us=90)
    dear_old = make_entry(1, restore_us=400_000.0, last_used_us=1)
    cheap_old = make_entry(2, restore_us=20_000.0, last_used_us=5)
    assert ids(tlru.order([cheap_recent, dear_old, cheap_old], 100)) == [2, 0, 1]


def test_oracle_cuts_only_chain_tails_when_entries_form_a_prefix_chain() -> None:
    oracle = make("oracle")
    assert isinstance(oracle, OraclePolicy)
    # Entries 0 -> 1 -> 2 are one chain (root first); 3 stands alone. The root is the cheapest
    # per byte, but it can only go together with everything after it.
    entries = [
        make_entry(0, num_bytes=100, restore_us=1.0, gap_ema_us=1e6),
        make_entry(1, num_bytes=100, restore_us=500.0, gap_ema_us=1e6),
        make_entry(2, num_bytes=100, restore_us=400.0, gap_ema_us=1e6),
        make_entry(3, num_bytes=100, restore_us=300.0, gap_ema_us=1e6),
    ]
    free = oracle.solve(entries, 100, 0)
    chained = oracle.solve(entries, 100, 0, chains=[[0, 1, 2], [3]])
    assert free.chosen == (0,)
    assert chained.chosen == (3,)  # the cheapest tail: entry 3 (300) beats tail 2 (400)
    both = oracle.solve(entries, 200, 0, chains=[[0, 1, 2], [3]])
    assert both.chosen == (2, 3)


@pytest.mark.parametrize("policy", ["arc", "slru", "gdsf", "perc_hazard", "wild"])
def test_stateful_policies_give_identical_runs_on_one_seed(policy: str) -> None:
    cfg = make_sim_config(policy=policy_config(policy))
    first, second = build(cfg).run(), build(cfg).run()
    assert first.requests.equals(second.requests)
    assert first.metrics["evictions"] > 0


def test_survival_estimate_keeps_a_sessions_past_gaps_when_it_starts_a_new_one() -> None:
    km = SurvivalEstimate(max_subjects=100)
    km.release(7, 0)
    km.returned(7, 4_000_000)  # gap of 4 s observed
    km.release(7, 9_000_000)  # its next turn ended: a new gap starts, the old one must stay
    curve = km.curve(now_us=10_000_000)
    assert curve is not None and curve[0].tolist() == [4_000_000.0]
