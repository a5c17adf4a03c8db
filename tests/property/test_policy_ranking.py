"""A policy's ranking is its key: for every registered ranking policy, after any history of hooks,
the victims of a decision are the candidates sorted by key, taken until the bytes are freed."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import (
    CacheEntry,
    GapEstimator,
    RankingPolicy,
    known_policies,
    make_policy,
)
from cachepilot_sim.policies.classic import ArcPolicy, SlruPolicy
from cachepilot_sim.policies.utility import MarconiPolicy

NOW = 10**9
# Policies that must see the whole candidate set choose with their own select (STYLE.md 3).
WHOLE_SET = {"oracle", "perc_plus1"}


def ranking_policies() -> list[RankingPolicy]:
    out = []
    for name in known_policies():
        if name in WHOLE_SET:
            continue
        cfg = policy_config(name)
        est = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
        policy = make_policy(cfg, est)
        assert isinstance(policy, RankingPolicy), name
        out.append(policy)
    return out


def entry(draw: st.DrawFn, i: int) -> CacheEntry:
    return CacheEntry(
        entry_id=i,
        session_id=i,
        model_index=0,
        class_index=draw(st.integers(0, 2)),
        priority=draw(st.integers(0, 2)),
        num_tokens=16,
        num_bytes=draw(st.integers(1, 40)) * 4096,
        created_us=draw(st.integers(0, NOW // 2)),
        last_used_us=draw(st.integers(0, 50)) * 10**6,
        num_uses=draw(st.integers(1, 4)),
        gap_ema_us=draw(st.sampled_from([-1.0, 1e6, 2e7, 3e8])),
        recompute_us=draw(st.floats(1.0, 1e6)),
        reload_us=draw(st.floats(1.0, 1e5)),
        restore_us=draw(st.floats(1.0, 1e6)),
        next_arrival_us=draw(st.sampled_from([-1, NOW + 10**6, NOW + 10**9])),
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[CacheEntry], list[tuple[str, int]], int]:
    """Candidates (up to 40: PERC vectorises from 32), hook calls before the decision (on ids
    beyond the candidates too: ARC's ghosts, FIFO's re-entries), and the bytes asked."""
    n = draw(st.integers(1, 40))
    entries = [entry(draw, i) for i in range(n)]
    hooks = draw(
        st.lists(
            st.tuples(st.sampled_from(["access", "release", "evict"]), st.integers(0, n + 5)),
            max_size=30,
        )
    )
    need = draw(st.integers(1, sum(e.num_bytes for e in entries) + 4096))
    return entries, hooks, need


def replay(policy: RankingPolicy, entries: list[CacheEntry], hooks: list[tuple[str, int]]) -> None:
    """Feed the hooks as a KV manager would: an entry is released (idle), then accessed (its
    next turn) or evicted; every candidate ends idle. Ids past the candidates are sessions that
    came and went (ARC's ghosts, FIFO's re-entries)."""
    by_id = {e.entry_id: e for e in entries}
    state: dict[int, str] = {}  # entry id -> "idle" | "busy" | "gone"
    now = 0

    def call(kind: str, e: CacheEntry, after: str) -> None:
        nonlocal now
        now += 1000
        getattr(policy, f"on_{kind}")(e, now)
        state[e.entry_id] = after

    for kind, i in hooks:
        e = by_id.get(i) or CacheEntry(i, i, 0, 0, 1, 16, 8192, 0, 0)
        current = state.get(i, "busy")
        if kind == "release" and current == "busy":
            call("release", e, "idle")
        elif kind == "access" and current in ("idle", "gone"):
            call("access", e, "busy")
        elif kind == "evict" and current == "idle":
            call("evict", e, "gone")
    for e in entries:
        if state.get(e.entry_id) == "gone":
            call("access", e, "busy")
        if state.get(e.entry_id, "busy") == "busy":
            call("release", e, "idle")


@settings(max_examples=60, deadline=None)
@given(histories())
def test_victims_are_the_candidates_sorted_by_key(
    case: tuple[list[CacheEntry], list[tuple[str, int]], int],
) -> None:
    entries, hooks, need = case
    for policy in ranking_policies():
        replay(policy, entries, hooks)
        victims = [v.entry_id for v in policy.select_victims(entries, need, NOW)]
        policy.prepare(entries, NOW)  # idempotent: the decision's context again
        by_key = sorted(entries, key=lambda e: policy.key(e, NOW))
        expected, freed = [], 0
        for e in by_key:
            if freed >= need:
                break
            expected.append(e.entry_id)
            freed += e.num_bytes
        assert victims == expected, policy.name
        assert [e.entry_id for e in policy.order(entries, NOW)] == [e.entry_id for e in by_key]


# The rules as stated in each paper (and as these policies ranked before their keys carried
# them): the key ranking must reproduce them exactly.
def slru_rule(p: SlruPolicy, entries: list[CacheEntry]) -> list[int]:
    room = p.protected_fraction * sum(e.num_bytes for e in entries)
    kept: list[CacheEntry] = []
    for e in sorted(
        (e for e in entries if e.entry_id in p.protected),
        key=lambda e: (-e.last_used_us, e.entry_id),
    ):
        if e.num_bytes > room:
            break
        kept.append(e)
        room -= e.num_bytes
    keep = {e.entry_id for e in kept}
    probation = [e for e in entries if e.entry_id not in keep]
    return [e.entry_id for e in sorted(probation, key=lru) + sorted(kept, key=lru)]


def arc_rule(p: ArcPolicy, entries: list[CacheEntry]) -> list[int]:
    t1 = sorted((e for e in entries if e.entry_id not in p.frequent), key=lru)
    t2 = sorted((e for e in entries if e.entry_id in p.frequent), key=lru)
    t1_bytes = float(sum(e.num_bytes for e in t1))
    out: list[int] = []
    i = j = 0
    while i < len(t1) or j < len(t2):  # REPLACE: T1's LRU while T1 holds more than the target
        if i < len(t1) and (t1_bytes > p.target_bytes or j == len(t2)):
            out.append(t1[i].entry_id)
            t1_bytes -= t1[i].num_bytes
            i += 1
        else:
            out.append(t2[j].entry_id)
            j += 1
    return out


def marconi_rule(p: MarconiPolicy, entries: list[CacheEntry]) -> list[int]:
    def minmax(v: np.ndarray) -> np.ndarray:
        span = float(v.max() - v.min())
        return np.zeros_like(v) if span <= 0 else (v - v.min()) / span

    recency = np.array([e.last_used_us for e in entries], dtype=np.float64)
    flops = np.array([e.recompute_us / max(e.num_bytes, 1) for e in entries])
    u = minmax(recency) + p.flop_weight * minmax(flops)
    return [
        entries[i].entry_id
        for i in sorted(range(len(entries)), key=lambda i: (u[i], entries[i].entry_id))
    ]


def lru(e: CacheEntry) -> tuple[int, int]:
    return (e.last_used_us, e.entry_id)


@settings(max_examples=80, deadline=None)
@given(histories(), st.floats(0.0, 1.0), st.floats(0.0, 4.0), st.floats(0.0, 2e5))
def test_set_relative_rules_are_exactly_their_key_ranking(
    case: tuple[list[CacheEntry], list[tuple[str, int]], int],
    fraction: float,
    flop_weight: float,
    arc_target: float,
) -> None:
    entries, hooks, _ = case
    for name, values, rule in (
        ("slru", {"slru_protected_fraction": fraction}, slru_rule),
        ("arc", {}, arc_rule),
        ("marconi", {"flop_weight": flop_weight}, marconi_rule),
    ):
        cfg = policy_config(name, **values)
        policy = make_policy(cfg, GapEstimator(0.3, 2e7, 3e7))
        assert isinstance(policy, RankingPolicy)
        replay(policy, entries, hooks)
        if isinstance(policy, ArcPolicy):
            policy.target_bytes = arc_target
        assert [e.entry_id for e in policy.order(entries, NOW)] == rule(policy, entries), name
