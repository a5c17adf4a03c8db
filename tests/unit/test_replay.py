"""Replay through the simulator: arrivals at trace times, inferred sessions feeding PERC, the
experiments' table with the prefix-hit ratio, and bad traces reported from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachepilot_sim.components.kv import PrefixKvManager
from cachepilot_sim.config import (
    ModelConfig,
    OnError,
    ReplayConfig,
    RunConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.policies import known_policies
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload

MOONCAKE = "samples:mooncake_synthetic/synthetic_trace.jsonl"
AZURE = "samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def replay_config(**replay: object) -> dict:
    return dict(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=131_072),
        trace=TraceConfig(enabled=False),
        replay=ReplayConfig(**replay),
    )  # type: ignore[arg-type]


def test_requests_arrive_at_trace_times_scaled() -> None:
    sim = build(
        make_sim_config(
            **replay_config(format=TraceFormat.AZURE, path=AZURE, limit=50, time_scale=0.5)
        )
    )
    result = sim.run()
    assert sim.replay is not None
    expected = np.rint(sim.replay.table.arrival_us * 0.5).astype(np.int64)
    assert result.requests["arrival_us"].to_numpy().tolist() == expected.tolist()
    assert result.requests["prompt_tokens"][0] == 374  # line 2 of the Azure file
    assert result.metrics["completed"] == 50


def test_sharegpt_lengths_get_poisson_arrivals_that_depend_on_the_seed() -> None:
    path = "samples:sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    frames = [
        build(
            make_sim_config(
                seed=s,
                **replay_config(
                    format=TraceFormat.SHAREGPT, path=path, limit=30, arrival_rate_per_s=2.0
                ),
            )
        )
        .run()
        .requests
        for s in (0, 0, 1)
    ]
    arrivals = [f["arrival_us"].to_list() for f in frames]
    assert arrivals[0] == arrivals[1] != arrivals[2]
    assert frames[0]["prompt_tokens"].to_list() == frames[2]["prompt_tokens"].to_list()
    mean_gap_s = np.diff(arrivals[0]).mean() / 1e6
    assert 0.2 < mean_gap_s < 1.0  # 2 req/s


def test_inferred_session_gaps_feed_the_perc_estimate() -> None:
    sim = build(
        make_sim_config(
            policy=policy_config("perc"),
            **replay_config(format=TraceFormat.MOONCAKE, path=MOONCAKE),
        )
    )
    result = sim.run()
    kv = sim.kv
    assert isinstance(kv, PrefixKvManager) and sim.replay is not None
    s = sim.replay.sessions
    frame = result.requests
    # Expected gap of every continuation whose parent had finished: arrival - parent's finish.
    arrival, finish = frame["arrival_us"].to_numpy(), frame["finish_us"].to_numpy()
    child = np.flatnonzero(s.parent >= 0)
    gaps = arrival[child] - finish[s.parent[child]]
    observed = gaps[gaps >= 0]
    assert observed.size > 20
    with_gap = [e for e in kv.group_entries.values() if e.gap_ema_us >= 0]
    assert len(with_gap) == len(np.unique(s.session[child[gaps >= 0]]))
    assert sim.estimator.population_gap_us != 20e6  # moved away from the prior
    # The per-request table reports the inferred session, not the engine's per-request one.
    assert frame["session"].to_list() == s.session.tolist()


def test_same_config_and_seed_replay_identically() -> None:
    cfg = make_sim_config(
        policy=policy_config("perc"),
        **replay_config(format=TraceFormat.MOONCAKE, path=MOONCAKE, limit=120, time_scale=0.5),
    )
    runs = [build(cfg).run() for _ in range(2)]
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].metrics == runs[1].metrics
    assert runs[0].metrics["evictions"] > 0  # the CPU tier and eviction paths ran


def test_skipped_rows_are_reported_in_metrics_and_the_title(tmp_path: Path) -> None:
    lines = (
        (
            Path(__file__).parents[2] / "cachepilot_sim/workloads/samples/azure_llm_2023/"
            "AzureLLMInferenceTrace_conv.csv"
        )
        .read_text()
        .splitlines()[:40]
    )
    lines[5] = lines[5].rsplit(",", 1)[0] + ",-4"
    path = tmp_path / "conv.csv"
    path.write_text("\n".join(lines) + "\n")
    cfg = RunConfig(
        **replay_config(format=TraceFormat.AZURE, path=str(path), on_error=OnError.SKIP),
        workload=make_workload(),
        compare_policies=["lru"],
        write_requests=False,
    )
    report = run_experiment(cfg, tmp_path / "out")
    assert report["cells"][0]["trace_rows_skipped"] == 1
    assert report["cells"][0]["requests"] == 38
    assert "38 requests (1 bad rows skipped)" in report["title"]


def test_mooncake_experiment_prints_prefix_hit_ratio_for_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "+experiment=mooncake_synthetic",
            "replay.limit=60",
            "trace.enabled=false",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "prefix-hit" in proc.stdout
    report = json.loads((out / "metrics.json").read_text())
    assert set(report["summary"]) == set(known_policies())
    for cell in report["cells"]:
        assert 0 < cell["prefix_hit_ratio"] < 1 and cell["requests"] == 60
    assert "prefix-hit ratio" in (out / "summary.md").read_text()  # markdown: one-line headers


@pytest.mark.parametrize("bad", ['{"timestamp": 1, "input_length": 5}'])
def test_cli_stops_on_a_bad_row_naming_file_and_line(tmp_path: Path, bad: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}'
    trace = tmp_path / "t.jsonl"
    trace.write_text(f"{good}\n{bad}\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "+experiment=mooncake_synthetic",
            f"replay.path={trace}",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert f"{trace}:2: missing or non-numeric field 'output_length'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "metrics.json").exists()
