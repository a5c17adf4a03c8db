"""reuse_forecast as a vLLM cache policy, on the restated contract (tests/vllm_double.py, not
vLLM): the simulator's ReuseForecastPolicy fed by the chunk adapter's hooks."""

from __future__ import annotations

import pytest

from cachepilot_sim.config import HardwareConfig
from cachepilot_sim.cost import compute_fit, recompute_us
from cachepilot_sim.integrations.vllm.chunks import session_class
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.forecast_features import ReleaseState, bucket_values
from tests.vllm_double import ChunkStatus, DoubleForecastCachePolicy, ReqContext

S = 1_000_000
TPC = 16


def make_forecast(**params: object) -> tuple[DoubleForecastCachePolicy, list[int]]:
    now = [0]
    params_ = PercParams(tokens_per_chunk=TPC, **params)  # type: ignore[arg-type]
    policy = DoubleForecastCachePolicy(100, params_, lambda: now[0])
    return policy, now


def request(
    policy: DoubleForecastCachePolicy, session: int, cls: int, chunks: range, req: str
) -> list[tuple[int, int]]:
    """One request of `session` (class `cls`) that stores `chunks` and finishes."""
    ctx = ReqContext(req, {"session_id": session, "session_class": cls})
    keys = [(session, i) for i in chunks]
    for i, key in zip(chunks, keys, strict=True):
        ctx.set_offload_key_position(key, (i + 1) * TPC)
        status = ChunkStatus(i)
        policy.insert(key, status, ctx)
        status.ref_cnt = 0
        policy.mark_evictable(key)
    policy.on_request_finished((tuple(keys),), set(keys), set(), ctx)
    return keys


def test_class_comes_from_transfer_params_and_is_unknown_otherwise() -> None:
    assert session_class(ReqContext("r", {"session_class": 2}), "session_class") == 2
    assert session_class(ReqContext("r", {"session_id": 1}), "session_class") == -1
    assert session_class(ReqContext("r", {"session_class": True}), "session_class") == -1
    assert session_class(ReqContext("r"), "session_class") == -1


def test_a_release_picks_the_curve_of_the_sessions_class_context_and_gaps() -> None:
    policy, now = make_forecast()
    request(policy, 7, 3, range(4), "a")  # longctx class, 64 tokens, first release
    now[0] = 40 * S
    request(policy, 7, 3, range(4, 6), "b")  # back after a 40 s gap: 96 tokens, second release
    ranking = policy.ranking
    entry_id = 0  # the first session the policy saw
    state = ReleaseState(3, 2, 6 * TPC, 40 * S, 40 * S, 1, 2)
    expected = ranking.table.row(bucket_values(ranking.table.features, state))
    assert ranking.rows[entry_id] == expected
    no_gap = ReleaseState(0, 2, 96, -1, 0, 0, 2)
    other = ranking.table.row(bucket_values(ranking.table.features, no_gap))
    assert expected != other  # the class and the gap reach the features


def test_each_victim_session_has_the_smallest_forecast_key_and_teaches_delta() -> None:
    policy, now = make_forecast(delta_s=30.0)
    fit = compute_fit(HardwareConfig())
    keys: dict[int, list[tuple[int, int]]] = {}
    for s in range(6):  # six sessions of different classes, depths and idle times
        now[0] = s * 50 * S
        keys[s] = request(policy, s, s % 4, range(s + 1), f"r{s}")
    now[0] = 400 * S
    delta_before = policy.ranking.metrics()["forecast_delta_s"]
    left = set(range(6))
    while left:
        expected = min(
            left,
            key=lambda s: policy.ranking.key(
                CacheEntry(
                    s,
                    s,
                    0,
                    s % 4,
                    0,
                    (s + 1) * TPC,
                    (s + 1) * TPC,
                    0,
                    s * 50 * S,
                    restore_us=sum(
                        recompute_us(fit, (i + 1) * TPC) - recompute_us(fit, i * TPC)
                        for i in range(s + 1)
                    ),
                ),
                now[0],
            ),
        )
        evicted = policy.evict(len(keys[expected]), set())
        assert evicted is not None and {k for k, _ in evicted} == set(keys[expected])
        left.remove(expected)
    # Every eviction pulls delta towards the idle age of its session (100-400 s > 30 s).
    assert policy.ranking.metrics()["forecast_delta_s"] > delta_before
    assert policy.evict(1, set()) is None


@pytest.mark.parametrize("model", ["mixed_spike", "mooncake_synthetic"])
def test_the_table_named_in_the_parameters_is_loaded(model: str) -> None:
    policy, _ = make_forecast(forecast_model=model)
    assert policy.ranking.table.meta["experiment"] == model  # type: ignore[attr-defined]
