"""Sweeps: joblib by default, one folder per job, a failing job isolated, reruns skip done jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.experiment.sweep import JOB_FILE
from cachepilot_sim.tools.collect import collect, main, parse_override

TINY = ["workload.num_requests=20", "workload.max_active_sessions=4", "hydra.launcher.n_jobs=2"]


def multirun(sweep_dir: Path, *params: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "--multirun",
            *params,
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    # vram_gb=8 cannot hold the 8 GB model: those two jobs fail, the other four must not care.
    sweep_dir = tmp_path_factory.mktemp("sweep") / "s"
    return sweep_dir, multirun(sweep_dir, "policy=perc,lru", "vram_gb=16,24,8")


def test_sweep_runs_on_joblib_with_one_folder_per_job(sweep) -> None:  # noqa: ANN001
    sweep_dir, proc = sweep
    assert "Joblib.Parallel" in proc.stderr + proc.stdout
    jobs = sorted(p.parent.parent.name for p in sweep_dir.glob("*/.hydra/overrides.yaml"))
    assert len(jobs) == 6
    assert "policy=lru,vram_gb=24,workload.max_active_sessions=4,workload.num_requests=20" in jobs


def test_failed_job_is_named_with_its_reason_and_others_complete(sweep) -> None:  # noqa: ANN001
    sweep_dir, proc = sweep
    assert proc.returncode == 1
    assert "4 jobs complete, 2 failed" in proc.stdout
    assert "policy=perc,vram_gb=8" in proc.stderr and "cannot hold the model" in proc.stderr
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{JOB_FILE}")]
    failed = [r for r in records if r["status"] == "failed"]
    assert {r["status"] for r in records} == {"complete", "failed"} and len(failed) == 2
    assert all("vram_gb=8" in r["overrides"] and "ConfigError" in r["error"] for r in failed)
    assert len(list(sweep_dir.glob("*/metrics.json"))) == 4


def test_rerun_skips_complete_jobs_and_retries_failed_ones(sweep) -> None:  # noqa: ANN001
    sweep_dir, _ = sweep
    metrics = sorted(sweep_dir.glob("*/metrics.json"))
    before = {p: p.stat().st_mtime_ns for p in metrics}
    proc = multirun(sweep_dir, "policy=perc,lru", "vram_gb=16,24,8")
    assert proc.returncode == 1
    assert proc.stdout.count("skipped, results complete") == 4
    assert proc.stderr.count("failed: ConfigError") >= 2  # retried, and failing again
    assert {p: p.stat().st_mtime_ns for p in metrics} == before


def test_collect_gathers_jobs_with_overrides_as_columns_and_plots(sweep, tmp_path) -> None:  # noqa: ANN001
    sweep_dir, _ = sweep
    result = collect(sweep_dir, tmp_path / "out", metric="realized_restore_s")
    table = result["table"]
    assert table.height == 4 * 5  # complete jobs x 5 cells (1 policy, the default 5 seeds each)
    assert {"job", "policy", "seed", "vram_gb", "workload.num_requests"} <= set(table.columns)
    assert table["vram_gb"].dtype == pl.Int64 and set(table["vram_gb"]) == {16, 24}
    assert set(table["policy"]) == {"perc", "lru"} and (table["requests"] == 20).all()
    assert pl.read_csv(tmp_path / "out" / "collected.csv").height == 4 * 5
    assert result["plot"].name == "realized_restore_s_vs_vram_gb.png"
    assert result["plot"].stat().st_size > 5000
    failed = {j["job"]: j["error"] for j in result["failed"]}
    assert len(failed) == 2 and all("cannot hold the model" in e for e in failed.values())


def test_collect_reports_an_unreadable_job_by_file_and_keeps_the_rest(sweep, tmp_path) -> None:  # noqa: ANN001
    import shutil

    sweep_dir = tmp_path / "copy"
    shutil.copytree(sweep[0], sweep_dir)
    broken = sorted(sweep_dir.glob("*/metrics.json"))[0]
    broken.write_text('{"cells": 3}')
    assert main([str(sweep_dir)]) == 0
    jobs = pl.read_csv(sweep_dir / "jobs.csv")
    row = jobs.filter(pl.col("status") == "unreadable")
    assert row.height == 1 and "key 'cells' missing" in row["error"][0]
    assert str(broken) in row["error"][0]
    assert pl.read_parquet(sweep_dir / "collected.parquet").height == 3 * 5  # 3 readable jobs


def test_collect_of_a_folder_without_jobs_fails_clearly(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main([str(tmp_path)]) == 2
    assert "no job folders" in capsys.readouterr().err


def test_overrides_are_typed_as_hydra_parses_them() -> None:
    assert parse_override("vram_gb=16") == ("vram_gb", 16)
    assert parse_override("+kv.watermark_fraction=0.02") == ("kv.watermark_fraction", 0.02)
    assert parse_override("policy=perc") == ("policy", "perc")
    assert parse_override("compare_policies=[perc,lru]") == ("compare_policies", '["perc", "lru"]')
    assert parse_override("~trace") is None
    assert parse_override("policy.delta_s=1e3") == ("policy.delta_s", 1000.0)  # YAML: a string
    assert parse_override("kv.offload_enabled=false") == ("kv.offload_enabled", False)


def test_a_job_that_raises_records_error_and_traceback_without_raising(
    tmp_path: Path, capsys
) -> None:  # noqa: ANN001
    from omegaconf import OmegaConf

    from cachepilot_sim.experiment.sweep import is_complete, read_job, run_job

    cfg = OmegaConf.create({"seed": 0})  # not a RunConfig: the job fails while building it
    assert run_job(cfg, tmp_path, ["seed=0"], 7) == "failed"
    record = read_job(tmp_path)
    assert record is not None and record["status"] == "failed" and record["job"] == 7
    assert "Traceback" in record["traceback"] and record["error"].startswith("AssertionError")
    assert "job 7 (seed=0) failed: AssertionError" in capsys.readouterr().err
    assert not is_complete(tmp_path, record["config_sha256"])
