"""PERC and reuse_forecast behind vLLM 0.26's CachePolicy contract (integrations/vllm/compat026.py)
on the restated contract (tests/vllm_double.py; 0.26's ReqContext is `(req_id,
kv_transfer_params)`): the same decisions as the 0.33 path when no key position is known."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from cachepilot_sim.integrations.vllm.compat026 import Policy026
from cachepilot_sim.integrations.vllm.forecast_chunks import ForecastChunkPolicy
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy
from tests.vllm_double import ChunkStatus, ReqContext

S = 1_000_000
TPC = 16


@dataclass
class ReqContext026:
    """vLLM 0.26's ReqContext (vllm/v1/kv_offload/base.py): nothing else."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None


class Clock:
    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> int:
        return self.now_us


def store_033(policy: Any, session: str, chunks: range, req_id: str) -> None:
    """0.33's calls for one request that stores `chunks` and finishes (positions unknown)."""
    ctx = ReqContext(req_id, kv_transfer_params={"session_id": session})
    keys = [(session, i) for i in chunks]
    for key in keys:
        status = ChunkStatus(hash(key) & 0xFFFF)
        policy.insert(key, status, ctx)
        status.ref_cnt = 0
        policy.mark_evictable(key)
    policy.on_request_finished((), set(), set(), ctx)


def store_026(policy: Policy026, session: str, chunks: range, req_id: str) -> None:
    """0.26's calls for the same request: prepare_store's inserts, complete_store, the
    manager's on_request_finished."""
    ctx = ReqContext026(req_id, kv_transfer_params={"session_id": session})
    keys = [(session, i) for i in chunks]
    with policy.storing(ctx):
        statuses = []
        for key in keys:
            statuses.append(ChunkStatus(hash(key) & 0xFFFF))
            policy.insert(key, statuses[-1])
    for key, status in zip(keys, statuses, strict=True):
        status.ref_cnt = 0
        policy.mark_evictable(key)
    policy.request_finished(ctx)


@pytest.mark.parametrize("cls", [PercChunkPolicy, ForecastChunkPolicy])
def test_the_026_adapter_decides_as_the_033_path(cls: type) -> None:
    """Sessions returning every 10 s and every 300 s: identical victims through both contracts."""
    params = PercParams(tokens_per_chunk=TPC, delta_s=30.0, prior_gap_s=20.0)
    clock_a, clock_b = Clock(), Clock()
    new, old = Policy026(cls(100, params, clock_a)), cls(100, params, clock_b)
    plan = [(t * 300 * S, "slow", t) for t in range(4)]
    plan += [(862 * S + t * 10 * S, "fast", t) for t in range(4)]
    for now, session, turn in plan:
        clock_a.now_us = clock_b.now_us = now
        chunks = range(turn * 2, turn * 2 + 2)
        store_026(new, session, chunks, f"{session}{turn}")
        store_033(old, session, chunks, f"{session}{turn}")
    clock_a.now_us = clock_b.now_us = 902 * S
    for n in (3, 5):
        got, want = new.evict(n, set()), old.evict(n, set())
        assert got is not None and want is not None
        assert [k for k, _ in got] == [k for k, _ in want]


def test_a_returning_session_trains_the_gap_estimator_through_the_manager_hook() -> None:
    clock = Clock()
    params = PercParams(tokens_per_chunk=TPC, ema_weight=0.5, prior_gap_s=20.0)
    policy = Policy026(PercChunkPolicy(100, params, clock))
    store_026(policy, "a", range(1), "r0")
    clock.now_us = 10 * S
    store_026(policy, "a", range(1, 2), "r1")
    assert policy.inner.estimator.population_gap_us == 0.5 * 20 * S + 0.5 * 10 * S
    assert policy._states == {}  # each request's state is dropped when it finishes


def test_an_insert_outside_a_store_is_refused() -> None:
    policy = Policy026(PercChunkPolicy(10, PercParams(tokens_per_chunk=TPC)))
    with pytest.raises(RuntimeError, match="outside prepare_store"):
        policy.insert(("a", 0), ChunkStatus(0))


def test_touch_and_clear_go_through_and_a_finish_without_calls_is_ignored() -> None:
    policy = Policy026(PercChunkPolicy(10, PercParams(tokens_per_chunk=TPC)))
    store_026(policy, "a", range(2), "r0")
    policy.request_finished(ReqContext026("never-seen"))
    policy.touch([("a", 0)], ReqContext026("r1", {"session_id": "b"}))
    assert policy.inner._chunks[("a", 0)].session is policy.inner._sessions["session:b"]
    policy.clear()
    assert policy.get(("a", 1)) is None and policy._states == {}


def _vllm_026() -> Any:
    try:
        import vllm
    except ImportError:
        return None
    return vllm if str(getattr(vllm, "__version__", "")).startswith("0.26.") else None


@pytest.mark.skipif(
    _vllm_026() is None,
    reason="needs vLLM 0.26 importable (PYTHONPATH=<site from experiments/validation/vllm>)",
)
def test_vllms_026_cpu_offloading_manager_runs_our_policy() -> None:
    """vLLM 0.26's own CPUOffloadingManager (store, complete, finish, evict) with PERC inside."""
    from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
    from vllm.v1.kv_offload.base import make_offload_key

    from cachepilot_sim.integrations.vllm.spec026 import PercCPUOffloadingManager026

    policy = Policy026(PercChunkPolicy(4, PercParams(tokens_per_chunk=256)))
    manager = PercCPUOffloadingManager026(4, policy)

    def request(rid: str, session: str, hashes: list[bytes]) -> Any:
        ctx = VllmReqContext(req_id=rid, kv_transfer_params={"session_id": session})
        manager.on_new_request(ctx)
        out = manager.prepare_store([make_offload_key(h, 0) for h in hashes], ctx)
        manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
        return out

    assert request("r0", "a", [b"a0", b"a1"]).evicted_keys == []
    assert request("r1", "b", [b"b0", b"b1"]).evicted_keys == []
    out = request("r2", "c", [b"c0", b"c1", b"c2"])
    assert len(out.keys_to_store) == 3 and len(out.evicted_keys) == 3
    assert out.evicted_keys[:2] == [make_offload_key(b"a1", 0), make_offload_key(b"a0", 0)]
