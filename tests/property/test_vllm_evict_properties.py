"""vLLM's evict contract for our policy (on the restated contract, tests/vllm_double.py): exactly n
idle unprotected chunks, or None and nothing changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.integrations.vllm.params import PercParams
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
