"""The lane index of GDSF, Wild and clairvoyant PERC (`policies/lanes.py`) pops what
the policy's own key puts first, on random streams of idle entries, hooks and time.

Each op adds an entry (released through the policy's hook or not: GDSF then reads the current
inflation), discards one, advances time, feeds Wild's class statistics, or pops: the popped id
must be the one with the smallest `policy.key` among the indexed entries, and the pop is then
reported to the policy as an eviction (GDSF's inflation rises). The managers' use of these
indexes is checked against the full sort in test_indexed_eviction.py.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.reuse import GapEstimator

ops_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 40), st.integers(0, 3_000), st.integers(0, 11)),
    min_size=1,
    max_size=200,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["gdsf", "wild", "perc_clairvoyant"]),
    ops=ops_strategy,
    delta_us=st.sampled_from([1.0, 700.0, 2_500.5]),
)
def test_pops_follow_the_policy_key(
    name: str, ops: list[tuple[int, int, int, int]], delta_us: float
) -> None:
    policy = make_policy(policy_config(name), GapEstimator(0.3, 900.0, delta_us))
    index = policy.time_index()  # type: ignore[attr-defined]
    idle: dict[int, CacheEntry] = {}
    known: dict[int, CacheEntry] = {}
    now = 5_000
    for kind, a, b, c in ops:
        if kind <= 3:  # an entry goes idle (now, or earlier), released through the hook or not
            entry = known.get(a) or CacheEntry(a, a, 0, c % 3, 0, 16, 1 + (b % 4) * 100, 0, 0)
            known[a] = entry
            entry.last_used_us = now - (b if kind == 3 else 0)
            entry.num_uses = 1 + c % 3
            entry.restore_us = [0.0, 100.0, 250.0, float(b), 1 / 3][(a + c) % 5]
            # Arrivals at δ from now (± 1 µs) probe the moment an entry's P becomes 1.
            edge = now + int(delta_us) + b % 3 - 1
            arrivals = [-1, now - b, now + b, now + 10 * b, edge, edge, edge + 1, edge - 1]
            entry.next_arrival_us = arrivals[(a + c) % 8]
            if kind != 2:
                policy.on_release(entry, now)
            index.add(entry, entry.restore_us, -1.0)
            idle[a] = entry
        elif kind == 4:
            index.discard(a)
            idle.pop(a, None)
        elif kind <= 6:
            now += [0, 1, b, 7 * b, 1][c % 5]
        elif kind == 7 and a in known:  # Wild's class statistics move (a return)
            policy.on_access(known[a], now)
        else:
            want = min(idle.values(), key=lambda e: policy.key(e, now), default=None)
            got = index.pop_min(now)
            assert got == (want.entry_id if want is not None else None)
            if want is not None:
                policy.on_evict(idle.pop(got), now)
        assert len(index) == len(idle)


def test_clairvoyant_p_turns_to_one_when_the_arrival_is_within_delta() -> None:
    """δ = 2500.5 µs: an arrival 2501 µs away is beyond δ (key 0, first) even with the larger
    restore per byte; one 2500 µs away is within it (key restore / bytes)."""
    policy = make_policy(policy_config("perc_clairvoyant"), GapEstimator(0.3, 900.0, 2500.5))
    index = policy.time_index()  # type: ignore[attr-defined]
    now = 10_000
    for eid, until, restore in ((1, 2500, 10.0), (2, 2501, 99.0)):
        e = CacheEntry(eid, eid, 0, 0, 0, 16, 100, 0, now, next_arrival_us=now + until)
        e.restore_us = restore
        index.add(e, restore, -1.0)
    assert [index.pop_min(now), index.pop_min(now)] == [2, 1]
