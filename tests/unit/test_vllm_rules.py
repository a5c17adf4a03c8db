"""engine=vllm_v1 rules checked against vLLM 0.26's scheduler (docs/vllm.md, "Rules checked
against vLLM 0.26"): a step that preempts admits nothing, a request at its length cap takes no
slot in the next async step, a finished request shares the blocks of its first P + O - 1
tokens, and the profile's defaults are 0.26's."""

from __future__ import annotations

import glob
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.block_hashes import (
    num_shared_blocks,
    num_shared_blocks_vllm,
    shared_blocks_rule,
)
from cachepilot_sim.validation.ground_truth import GroundTruth
from cachepilot_sim.validation.replay import workload_from_ground_truth
from tests.engine_runs import ground_truth, pressure


def _run(gt: GroundTruth, tmp_path: Path, *overrides: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    run_cfg = sim_config("vllm_v1", ["trace.enabled=true", "trace.iteration_every=1", *overrides])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    result = build(cfg, tmp_path / "trace", workload).run()
    parts = sorted(glob.glob(str(tmp_path / "trace" / "**" / "*.parquet"), recursive=True))
    return result.requests, pl.concat([pl.read_parquet(p) for p in parts])


def _admits_at_a_preemption(trace: pl.DataFrame) -> tuple[int, int]:
    """(preemptions, admissions at the time of a preemption: in the step that preempted)."""
    ev = trace.filter(pl.col("kind").is_in(["preempt", "admit"]))
    preempt_times = set(ev.filter(pl.col("kind") == "preempt")["t_us"].to_list())
    admits = ev.filter((pl.col("kind") == "admit") & pl.col("t_us").is_in(list(preempt_times)))
    return len(preempt_times), admits.height


@pytest.mark.parametrize(("admit_after", "admits_expected"), [("false", False), ("true", True)])
def test_a_step_that_preempts_admits_no_waiting_request(
    tmp_path: Path, admit_after: str, admits_expected: bool
) -> None:
    """Scheduler.schedule: `if not preempted_reqs` guards the waiting queue; the control
    (admission after a preemption) shows the check can fail."""
    reqs, trace = _run(
        pressure(),
        tmp_path,
        "engine.kv_pool_blocks=150",
        f"engine.admit_after_preemption={admit_after}",
    )
    assert (reqs["outcome"] == "completed").all()
    preempts, admits = _admits_at_a_preemption(trace)
    assert preempts > 0, "the workload must preempt for this test to mean anything"
    assert (admits > 0) == admits_expected


def test_a_request_at_its_length_cap_takes_no_slot_in_the_next_async_step(
    tmp_path: Path,
) -> None:
    """vLLM 0.26 skips a running request once its placeholders reach prompt + max_tokens; the
    transformers rule (a finished request rides along in the step composed before it ended,
    reading its KV) makes the longer request's next step slower."""
    gt = ground_truth([4000, 64], [2, 400], [0, 0])
    finish = {}
    for slot in ("false", "true"):
        reqs, _ = _run(gt, tmp_path / slot, f"engine.async_finish_slot={slot}")
        finish[slot] = reqs.sort("request")["finish_us"].to_list()[1]
    assert finish["false"] < finish["true"]


@pytest.mark.parametrize(
    ("prompt", "output", "vllm", "hf"),
    [(30, 3, 2, 1), (32, 1, 2, 2), (16, 16, 1, 1), (20, 13, 2, 1), (100, 1, 6, 6)],
)
def test_vllm_shares_the_blocks_of_every_computed_token(
    prompt: int, output: int, vllm: int, hf: int
) -> None:
    """vLLM caches each block once its KV is computed: the first P + O - 1 tokens' full blocks
    (the last sampled token is never computed); transformers stops one token earlier."""
    assert num_shared_blocks_vllm(prompt, output, 16) == vllm
    assert num_shared_blocks(prompt, output, 16) == hf


def test_a_vllm_ground_truth_replays_with_vllms_shared_blocks_rule() -> None:
    assert shared_blocks_rule("vllm_v1") is num_shared_blocks_vllm
    assert shared_blocks_rule("transformers-continuous-batching") is num_shared_blocks
    assert shared_blocks_rule(None) is num_shared_blocks


def test_the_profile_defaults_are_vllm_026s_on_a_large_gpu() -> None:
    cfg = sim_config("vllm_v1", [])
    assert (cfg.batcher.throughput_token_budget, cfg.batcher.throughput_max_seqs) == (8192, 1024)
    assert cfg.engine.async_scheduling and not cfg.engine.async_finish_slot
    assert not cfg.engine.admit_after_preemption
    assert cfg.kv.block_tokens == cfg.replay.hash_block_tokens == 16
