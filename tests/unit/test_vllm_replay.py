"""The evictor benchmark's op stream and replay harness, driven with our policy on the restated
contract (tests/vllm_double.py); the run against vLLM's own classes is in test_vllm_real.py."""

from __future__ import annotations

import time

import pytest

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import HardwareConfig, ModelConfig
from cachepilot_sim.integrations.vllm.evictor_bench import load_workload
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.replay import (
    ReplayConfig,
    Replayer,
    Turn,
    VllmTypes,
    make_turns,
    replay,
)
from tests.vllm_double import ChunkStatus, DoublePercCachePolicy, ReqContext

TPC = 256


def turns_for_test(num_sessions: int = 60) -> list[Turn]:
    workload = load_workload(CONF_DIR / "workload/mixed.yaml", session_rate_per_s=1.0)
    return make_turns(workload, ReplayConfig(TPC, 20.0, num_sessions, seed=1))


def replay_perc(turns: list[Turn], capacity: int) -> Replayer:
    clock = [0]
    policy = DoublePercCachePolicy(capacity, PercParams(tokens_per_chunk=TPC), lambda: clock[0])
    rep = Replayer(
        policy,
        capacity,
        VllmTypes(ChunkStatus, ReqContext),
        HardwareConfig(),
        ModelConfig(),
        TPC,
        clock,
    )
    replay(rep, turns, time.perf_counter_ns)
    return rep


def test_turns_are_time_ordered_and_each_turn_resumes_the_previous_prompt() -> None:
    turns = turns_for_test()
    assert turns == turns_for_test()  # same seed, same op stream
    assert [t.t_us for t in turns] == sorted(t.t_us for t in turns)
    last: dict[int, Turn] = {}
    for turn in turns:
        prev = last.get(turn.session)
        assert turn.prior_chunks == (0 if prev is None else prev.num_chunks)
        assert prev is None or turn.t_us >= prev.end_us
        last[turn.session] = turn


def test_an_ample_cache_reloads_everything_and_recomputes_nothing() -> None:
    turns = turns_for_test()
    rep = replay_perc(turns, capacity=100_000)
    assert rep.stats.num_decisions == 0 and rep.stats.recompute_us == 0.0
    assert rep.stats.num_hit_chunks == sum(t.prior_chunks for t in turns) > 0


def test_a_small_cache_evicts_and_pays_recompute_for_what_it_lost() -> None:
    turns = turns_for_test()
    rep = replay_perc(turns, capacity=150)
    s = rep.stats
    assert s.num_decisions > 0 and s.num_evicted_chunks > 0 and s.recompute_us > 0
    assert s.num_hit_chunks + s.num_missed_chunks == sum(t.prior_chunks for t in turns)
    assert rep.num_resident <= 150


def test_a_policy_that_evicts_fewer_than_asked_is_caught() -> None:
    class Short(DoublePercCachePolicy):
        def evict(self, n: int, protected: set[object]) -> list[tuple[object, object]] | None:
            result = super().evict(n, protected)
            return None if result is None else result[:-1]

    clock = [0]
    policy = Short(40, PercParams(tokens_per_chunk=TPC), lambda: clock[0])
    rep = Replayer(
        policy, 40, VllmTypes(ChunkStatus, ReqContext), HardwareConfig(), ModelConfig(), TPC, clock
    )
    with pytest.raises(AssertionError, match="exactly n"):
        replay(rep, turns_for_test(), time.perf_counter_ns)
