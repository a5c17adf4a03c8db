"""Hypothesis properties of PERC's eviction order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cachepilot_sim.config import HardwareConfig, policy_config
from cachepilot_sim.cost import compute_fit, recompute_us
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.perc import PercPolicy

FIT = compute_fit(HardwareConfig())
BYTES_PER_TOKEN = 131072
NOW = 10**12

gaps = st.floats(min_value=1e3, max_value=1e10, allow_nan=False)
idles = st.integers(min_value=0, max_value=10**10)


def perc(delta_s: float = 30.0) -> PercPolicy:
    cfg = policy_config("perc", delta_s=delta_s)
    policy = make_policy(cfg, GapEstimator(cfg.ema_weight, 20e6, delta_s * 1e6))
    assert isinstance(policy, PercPolicy)
    return policy


def entry(
    entry_id: int, gap: float, idle: int, tokens: int = 1024, restore: float | None = None
) -> CacheEntry:
    return CacheEntry(
        entry_id=entry_id,
        session_id=entry_id,
        model_index=0,
        class_index=0,
        priority=0,
        num_tokens=tokens,
        num_bytes=tokens * BYTES_PER_TOKEN,
        created_us=0,
        last_used_us=NOW - idle,
        gap_ema_us=gap,
        restore_us=recompute_us(FIT, tokens) if restore is None else restore,
    )


@given(gaps, gaps, idles, st.floats(min_value=1, max_value=600))
def test_higher_reuse_rate_never_ranks_earlier(
    gap_a: float, gap_b: float, idle: int, delta_s: float
) -> None:
    """Equal bytes, restore cost and idle time: the session that returns more often (shorter gap,
    higher lambda) is never evicted before the other."""
    p = perc(delta_s)
    frequent, rare = (
        (entry(0, gap_a, idle), entry(1, gap_b, idle))
        if gap_a <= gap_b
        else (entry(0, gap_b, idle), entry(1, gap_a, idle))
    )
    assert p.score(frequent, NOW) >= p.score(rare, NOW)


@given(st.integers(1, 131072), st.integers(1, 131072), gaps, idles)
def test_longer_context_is_never_cheaper_per_byte_under_recompute(
    n1: int, n2: int, gap: float, idle: int
) -> None:
    """With restore = recompute (superlinear in tokens), more context never lowers the score."""
    p = perc()
    short, long_ = sorted((n1, n2))
    assert p.score(entry(0, gap, idle, short), NOW) <= p.score(entry(1, gap, idle, long_), NOW) * (
        1 + 1e-12
    )


@given(gaps, idles, idles)
def test_dormant_session_is_evicted_no_later_than_active_one(gap: float, i1: int, i2: int) -> None:
    """Same history: the session idle for longer never has the higher score."""
    p = perc()
    active_idle, dormant_idle = sorted((i1, i2))
    assert p.score(entry(1, gap, dormant_idle), NOW) <= p.score(entry(0, gap, active_idle), NOW)


@given(
    st.lists(st.tuples(gaps, idles, st.integers(1, 65536)), min_size=1, max_size=80),
    st.randoms(use_true_random=False),
)
def test_order_is_total_stable_and_independent_of_input_order(rows, rnd) -> None:  # noqa: ANN001
    p = perc()
    entries = [entry(i, g, idle, n) for i, (g, idle, n) in enumerate(rows)]
    first = [e.entry_id for e in p.order(entries, NOW)]
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert [e.entry_id for e in p.order(shuffled, NOW)] == first
    assert sorted(first) == list(range(len(entries)))
    keys = [p.key(e, NOW) for e in entries]
    assert len(set(keys)) == len(keys)  # the id ends every key: no ties
