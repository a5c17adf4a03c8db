from __future__ import annotations

import polars as pl
import pytest

from cachepilot_sim.config import BatcherConfig, KVConfig, ModelConfig, TraceConfig, WorkloadClass
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload


def run(**overrides):  # noqa: ANN003, ANN201
    return build(make_sim_config(**overrides)).run()


def test_same_config_and_seed_give_identical_results_and_trace() -> None:
    a, b = run(seed=3), run(seed=3)
    assert a.requests.equals(b.requests)
    assert a.trace.equals(b.trace)
    assert a.metrics == b.metrics


def test_different_seeds_give_different_workloads() -> None:
    assert not run(seed=1).requests.equals(run(seed=2).requests)


def test_every_request_is_completed_or_rejected_with_a_reason() -> None:
    result = run()
    req = result.requests
    assert req.height == 120
    assert set(req["outcome"].unique()) <= {"completed", "rejected"}
    rejected = req.filter(pl.col("outcome") == "rejected")
    assert (rejected["reject_reason"].str.len_chars() > 0).all()
    done = req.filter(pl.col("outcome") == "completed")
    assert (done["generated"] == done["output_tokens"]).all()
    assert (done["first_token_us"] >= done["arrival_us"]).all()
    assert (done["finish_us"] >= done["first_token_us"]).all()


def test_policies_face_identical_sessions_on_one_seed() -> None:
    """Common random numbers: first-turn prompts of the first sessions do not depend on policy."""
    from cachepilot_sim.config import policy_config

    def first_turns(name: str) -> pl.DataFrame:
        req = run(policy=policy_config(name)).requests
        return (
            req.filter(pl.col("turn") == 0)
            .sort("session")
            .head(20)
            .select("session", "workload_class", "prompt_tokens", "output_tokens")
        )

    assert first_turns("lru").equals(first_turns("perc"))


def test_decode_runs_equal_step_by_step_simulation_without_memory_pressure() -> None:
    """With ample memory, simulating up to 256 decode steps per event changes nothing."""
    big = dict(vram_gb=80.0, kv=KVConfig(offload_enabled=False))
    step = run(batcher=BatcherConfig(max_decode_run=1), **big)
    fast = run(batcher=BatcherConfig(max_decode_run=256), **big)
    assert step.metrics["evictions"] == 0
    cols = ["request", "first_token_us", "finish_us", "generated"]
    assert step.requests.select(cols).equals(fast.requests.select(cols))


def test_offload_off_turns_evictions_into_drops_and_returns_into_recomputes() -> None:
    m = run(kv=KVConfig(offload_enabled=False)).metrics
    assert m["evictions"] > 0 and m["evictions_offload"] == 0 and m["reloads"] == 0
    assert m["recomputes"] > 0 and m["realized_recompute_s"] > 0
    assert m["realized_reload_s"] == 0


def test_offload_on_brings_sessions_back_over_pcie() -> None:
    m = run().metrics
    assert m["evictions_offload"] > 0 and m["reloads"] > 0 and m["realized_reload_s"] > 0
    assert m["pcie_d2h_gb"] > 0 and m["pcie_h2d_gb"] > 0
    assert m["realized_restore_s"] == pytest.approx(
        m["realized_reload_s"] + m["realized_recompute_s"]
    )


def test_tight_memory_preempts_running_requests_and_still_finishes_everything() -> None:
    model = ModelConfig(weight_bytes=1_000_000_000, num_layers=4, max_context_tokens=32768)
    # 100 MB of KV at 16 KiB per token = 6,100 tokens for 16 sessions of ~500: decode must preempt.
    cfg = dict(
        model=model,
        vram_gb=1.1,
        batcher=BatcherConfig(latency_max_seqs=64, throughput_max_seqs=64),
        kv=KVConfig(activation_reserve_bytes=0, offload_enabled=False),
        workload=make_workload(
            session_rate_per_s=20.0,
            classes={
                "chat": WorkloadClass(
                    prompt_tokens_mean=200,
                    output_tokens_mean=600,
                    turns_mean=3,
                    think_time_mean_s=0.2,
                )
            },
        ),
    )
    result = run(**cfg)
    m = result.metrics
    assert m["preemptions"] > 0 and m["preempt_recompute_s"] > 0
    assert m["completed"] + m["rejected"] == m["requests"]


def test_request_larger_than_the_kv_pool_is_rejected_with_reason() -> None:
    model = ModelConfig(weight_bytes=1_000_000_000, max_context_tokens=32768)
    wl = make_workload(
        num_requests=10,
        classes={
            "huge": WorkloadClass(prompt_tokens_mean=20000, prompt_tokens_sigma=0.0, turns_mean=1)
        },
    )
    result = run(model=model, vram_gb=1.2, workload=wl, kv=KVConfig(activation_reserve_bytes=0))
    req = result.requests
    assert (req["outcome"] == "rejected").all()
    assert (req["reject_reason"] == "exceeds_kv_capacity").all()


def test_two_models_share_the_pool_with_their_own_kv_geometry() -> None:
    small = ModelConfig(name="small", num_layers=28, num_kv_heads=2, weight_bytes=3_090_000_000)
    classes = {"big": WorkloadClass(share=0.5), "small": WorkloadClass(share=0.5, model="small")}
    cfg = make_sim_config(
        vram_gb=24.0, extra_models=[small], workload=make_workload(classes=classes)
    )
    result = build(cfg).run()
    per_model = result.requests.group_by("model").len().sort("model")
    assert per_model["model"].to_list() == [0, 1]
    assert result.metrics["kv_pool_gb"] == pytest.approx((24e9 - 8.03e9 - 3.09e9 - 2**30) / 1e9)


def test_trace_rows_are_ordered_and_can_be_switched_off() -> None:
    trace = run().trace
    assert trace.height > 0
    assert trace["seq"].to_list() == list(range(trace.height))
    assert trace["t_us"].is_sorted()
    assert run(trace=TraceConfig(enabled=False)).trace.height == 0
