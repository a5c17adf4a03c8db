"""vLLM's evict contract for our policy (on the restated contract, tests/vllm_double.py): exactly n
idle unprotected chunks, or None and nothing changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.integrations.vllm.chunks import SessionChunkPolicy
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy
from tests.vllm_double import ChunkStatus, DoublePercCachePolicy, ReqContext

op = st.tuples(
    st.sampled_from(["store", "pin", "unpin", "evict", "tick"]),
    st.integers(0, 4),  # session
    st.integers(1, 6),  # chunk count or n
)


@settings(max_examples=60, deadline=None)
@given(st.lists(op, max_size=40))
def test_evict_is_exact_or_atomic(ops: list[tuple[str, int, int]]) -> None:
    now = [0]
    policy = DoublePercCachePolicy(64, PercParams(tokens_per_chunk=16), lambda: now[0])
    resident: dict[tuple[int, int], ChunkStatus] = {}
    length = [0] * 5
    for step, (kind, session, count) in enumerate(ops):
        now[0] += 1_000_000
        keys = [k for k in resident if k[0] == session]
        if kind == "store":
            ctx = ReqContext(f"r{step}", {"session_id": session})
            for i in range(length[session], length[session] + count):
                ctx.set_offload_key_position((session, i), (i + 1) * 16)
                resident[(session, i)] = status = ChunkStatus(step * 10 + i)
                policy.insert((session, i), status, ctx)
                status.ref_cnt = 0
                policy.mark_evictable((session, i))
            length[session] += count
            policy.on_request_finished((), set(), set(), ctx)
        elif kind == "pin" and keys and resident[keys[0]].ref_cnt == 0:
            resident[keys[0]].ref_cnt = 1
            policy.mark_non_evictable(keys[0])
        elif kind == "unpin" and keys and resident[keys[0]].ref_cnt == 1:
            resident[keys[0]].ref_cnt = 0
            policy.mark_evictable(keys[0])
        elif kind == "evict":
            protected = set(keys[-1:])
            idle = [k for k, s in resident.items() if s.ref_cnt == 0 and k not in protected]
            before = {k: policy.get(k) for k in resident}
            result = policy.evict(count, protected)
            if len(idle) < count:
                assert result is None
                assert {k: policy.get(k) for k in resident} == before
            else:
                assert result is not None and len(result) == count
                victims = [k for k, _ in result]
                assert len(set(victims)) == count and set(victims) <= set(idle)
                for key, status in result:
                    assert status is resident.pop(key) and policy.get(key) is None
        assert all(policy.get(k) is s for k, s in resident.items())


step = st.tuples(
    st.sampled_from(["store", "reuse", "pin", "unpin", "evict", "tick"]),
    st.integers(0, 5),  # session
    st.integers(1, 6),  # chunk count, n, or a tick's size
)
TPC_LONG = 2048
TICKS_US = (0, 1, 700_000, 5_000_000, 20_000_001, 61_000_000, 300_000_000)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(step, max_size=60),
    st.sampled_from([5.0, 30.0]),
    # (vectorise_from, sort_after_picks): Python keys; NumPy keys taken one maximum at a time, or
    # sorted after 0 or 1 maxima. The sessions here are few, so 0 forces the NumPy side.
    st.sampled_from([(32, 8), (0, 8), (0, 0), (0, 1)]),
)
def test_array_ranked_perc_evicts_exactly_what_the_full_sort_evicts(
    ops: list[tuple[str, int, int]], delta_s: float, paths: tuple[int, int]
) -> None:
    """PercChunkPolicy (key inputs in arrays, re-put per decision; keys in Python or NumPy, taken
    by maxima or sorted) against SessionChunkPolicy (a CacheEntry per session sorted by the
    simulator's PercPolicy at every decision): same victims, same order, through returns (gaps
    learned), pins, protected keys, idle times across the horizon and exact ties."""
    now = [0]
    # Long chunks at depths that differ between sessions 0-2 (restore per byte differs) and are
    # the same for s and s + 3 (equal keys, broken by session id).
    params = PercParams(tokens_per_chunk=TPC_LONG, delta_s=delta_s, prior_gap_s=10.0)
    perc = PercChunkPolicy(64, params, lambda: now[0])
    perc.vectorise_from, perc.sort_after_picks = paths
    policies = [perc, SessionChunkPolicy(64, params, lambda: now[0])]
    resident: dict[tuple[int, int], list[ChunkStatus]] = {}
    length = [0] * 6
    for i, (kind, session, count) in enumerate(ops):
        keys = [k for k in resident if k[0] == session]
        if kind == "tick":
            now[0] += TICKS_US[count] + i
        elif kind in ("store", "reuse"):
            new = range(length[session], length[session] + (count if kind == "store" else 0))
            for policy in policies:
                ctx = ReqContext(f"r{i}", {"session_id": session})
                policy.on_request_access(keys, ctx)
                for j in new:
                    ctx.set_offload_key_position(
                        (session, j), (j + 1 + 4 * (session % 3)) * TPC_LONG
                    )
                    status = ChunkStatus(j)
                    resident.setdefault((session, j), []).append(status)
                    policy.insert((session, j), status, ctx)
                    status.ref_cnt = 0
                    policy.mark_evictable((session, j))
                policy.on_request_finished((tuple(keys),), set(), set(keys), ctx)
            length[session] += len(new)
        elif kind in ("pin", "unpin") and keys:
            pin = kind == "pin"
            statuses = resident[keys[0]]
            if statuses[0].ref_cnt == (0 if pin else 1):
                for policy, status in zip(policies, statuses, strict=True):
                    status.ref_cnt = 1 if pin else 0
                    (policy.mark_non_evictable if pin else policy.mark_evictable)(keys[0])
        elif kind == "evict":
            protected = set(keys[-count:])
            results = [policy.evict(count, protected) for policy in policies]
            victims = [None if r is None else [k for k, _ in r] for r in results]
            assert victims[0] == victims[1]
            for key in victims[0] or ():
                del resident[key]
        now[0] += 1
