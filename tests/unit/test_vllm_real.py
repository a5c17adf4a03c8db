"""Our policies (PERC, reuse_forecast) inside vLLM 0.33's own classes: loaded by module path through
CachePolicyFactory, driven with vLLM's ChunkStatus and ReqContext, next to vLLM's LRU and ARC on the
same scripts.

Skipped when vLLM is not installed (the default suite). To run:
    pip install --no-deps 'vllm==0.33.*' && pip install -e '.[vllm-policy]'
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest

factory_mod = pytest.importorskip(
    "vllm.v1.kv_offload.cpu.policies.factory",
    reason="vLLM 0.33 is not installed (optional: pip install --no-deps 'vllm==0.33.*' "
    "and the [vllm-policy] extra; see docs/vllm.md)",
)

from vllm.v1.kv_offload.base import ReqContext  # noqa: E402
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus  # noqa: E402

from cachepilot_sim.integrations.vllm import evictor_bench  # noqa: E402
from cachepilot_sim.integrations.vllm.params import ENV_VAR  # noqa: E402
from cachepilot_sim.integrations.vllm.policy import (  # noqa: E402
    FORECAST_POLICY_NAME,
    MODULE_PATH,
    POLICY_NAME,
)

Factory = factory_mod.CachePolicyFactory
S = 1_000_000
TPC = 16


def build(name: str, capacity: int = 64) -> Any:
    """As CPUOffloadingManager does: resolve by name (and module path), construct with capacity."""
    if name == "perc":
        return Factory.get_cache_policy_cls(POLICY_NAME, MODULE_PATH)(cache_capacity=capacity)
    if name == "reuse_forecast":
        cls = Factory.get_cache_policy_cls(FORECAST_POLICY_NAME, MODULE_PATH)
        return cls(cache_capacity=capacity)
    return Factory.get_cache_policy_cls(name)(cache_capacity=capacity)


def store(policy: Any, session: str, chunks: range, req: str, first_token: int = 0) -> list[bytes]:
    ctx = ReqContext(req, kv_transfer_params={"session_id": session})
    keys = [f"{session}:{i}".encode().ljust(12, b"\0") for i in chunks]
    for j, key in enumerate(keys):
        ctx.set_offload_key_position(key, first_token + (j + 1) * TPC)
        chunk = ChunkStatus(abs(hash(key)) % 10_000)
        policy.insert(key, chunk, ctx)
        chunk.ref_cnt = 0
        policy.mark_evictable(key)
    policy.on_request_finished((tuple(keys),), set(keys), set(), ctx)
    return keys


def reuse(policy: Any, session: str, keys: list[bytes], req: str) -> None:
    """A request of `session` that hits `keys` (the manager reports them when it finishes)."""
    ctx = ReqContext(req, kv_transfer_params={"session_id": session})
    policy.on_request_access(keys, ctx)
    policy.on_request_finished((tuple(keys),), set(), set(keys), ctx)


def test_vllm_factory_loads_our_policy_by_module_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, '{"delta_s": 12.5, "tokens_per_chunk": 32}')
    policy = build("perc", capacity=8)
    assert isinstance(policy, CachePolicy) and policy.cache_capacity == 8
    assert (policy.params.delta_s, policy.params.tokens_per_chunk) == (12.5, 32)
    forecast = build("reuse_forecast", capacity=8)
    assert isinstance(forecast, CachePolicy) and type(forecast).__name__ == FORECAST_POLICY_NAME
    assert forecast.ranking.name == "reuse_forecast"


@pytest.mark.parametrize("name", ["perc", "reuse_forecast", "lru", "arc"])
def test_every_policy_evicts_exactly_n_or_nothing(name: str) -> None:
    policy = build(name)
    a = store(policy, "a", range(3), "r0")
    b = store(policy, "b", range(2), "r1")
    policy.get(b[1]).ref_cnt = 1  # a load in flight
    policy.mark_non_evictable(b[1])
    protected = {a[0]}
    assert policy.evict(4, protected) is None  # only a1, a2, b0 are evictable
    assert all(policy.get(k) is not None for k in a + b)
    evicted = policy.evict(3, protected)
    assert evicted is not None and sorted(k for k, _ in evicted) == sorted([a[1], a[2], b[0]])
    assert all(policy.get(k) is None for k, _ in evicted)
    assert policy.evict(0, set()) == []


def test_perc_keeps_the_frequently_returning_session_that_lru_evicts() -> None:
    clock = [0]
    perc = build("perc")
    perc._clock = lambda: clock[0]  # scripted time instead of the monotonic clock
    lru = build("lru")
    victims: dict[str, set[str]] = {}
    for policy, name in ((perc, "perc"), (lru, "lru")):
        slow: list[bytes] = []
        for turn in range(4):  # slow: every 300 s; fast: every 10 s, last used before slow
            clock[0] = turn * 300 * S
            slow += store(policy, "slow", range(2 * turn, 2 * turn + 2), f"s{turn}", 2 * turn * TPC)
        for turn in range(4):
            clock[0] = 862 * S + turn * 10 * S
            store(policy, "fast", range(2 * turn, 2 * turn + 2), f"f{turn}", 2 * turn * TPC)
        clock[0] = 900 * S
        reuse(policy, "slow", slow, "s-last")
        clock[0] = 902 * S
        evicted = policy.evict(8, set())
        assert evicted is not None
        victims[name] = {k.split(b":")[0].decode() for k, _ in evicted}
    assert victims == {"perc": {"slow"}, "lru": {"fast"}}


def test_evictor_benchmark_runs_all_four_on_one_op_stream() -> None:
    argv = ["--capacity", "150", "--decisions", "20", "--seeds", "1", "--sessions", "150"]
    args = evictor_bench.parse_args(argv)
    result = evictor_bench.run(args)
    cells = {c["policy"]: c for c in result["cells"]}
    # Replayed twice in turn: the same decisions, each timed as its faster replay.
    twice = evictor_bench.run(evictor_bench.parse_args([*argv, "--repeats", "2"]))
    for cell in twice["cells"]:
        mine = cells[cell["policy"]]
        assert {k: v for k, v in cell.items() if "_us_" not in k} == {
            k: v for k, v in mine.items() if "_us_" not in k
        }
    assert twice["summary"]["lru"]["us_vs_lru"] == 1.0 and len(twice["host"]) == 2
    assert set(cells) == {"perc", "reuse_forecast", "lru", "arc"}
    assert cells["lru"]["decisions"] == 20  # the trace is cut at LRU's 20th decision
    assert len({c["turns"] for c in cells.values()}) == 1  # identical op stream
    for c in cells.values():
        assert c["restore_s"] == pytest.approx(c["reload_s"] + c["recompute_s"])
    table = evictor_bench.to_markdown(result)
    assert "| perc |" in table and "| reuse_forecast |" in table
    assert isinstance(args, Namespace)
