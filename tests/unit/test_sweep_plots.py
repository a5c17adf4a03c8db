"""Plots and the report of a tiny sweep (smoke experiment, vram_gb=10,16 x seed=0,1 as 4 jobs),
checked by reading back the numbers each figure wrote beside it against the jobs' metrics.json:
configurations are facets, seeds of one configuration are pooled (n=2), configurations never."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import pytest
import yaml
from scipy import stats

from cachepilot_sim.experiment.runset import RunSetError, check_no_pooling
from cachepilot_sim.tools.figures import latency_cdfs, load_runs, vram_figure
from cachepilot_sim.tools.plot import main as plot_main
from cachepilot_sim.tools.report import main as report_main

matplotlib.use("Agg")
POLICIES = ["perc", "lru", "priority"]  # the smoke experiment's compare_policies


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("plots") / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", "--multirun", "+experiment=smoke",
         "vram_gb=10,16", "seed=0,1", "seeds=1", "workload.num_requests=40",
         "telemetry.progress=false", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return sweep_dir


def job_cells(sweep_dir: Path) -> pl.DataFrame:
    """Every cell of every job's metrics.json, with the job's vram_gb (from its overrides)."""
    rows = []
    for path in sorted(sweep_dir.glob("*/metrics.json")):
        overrides = yaml.safe_load((path.parent / ".hydra" / "overrides.yaml").read_text())
        vram = float(next(o for o in overrides if o.startswith("vram_gb=")).split("=")[1])
        for cell in json.loads(path.read_text())["cells"]:
            rows.append({"job": path.parent.name, "vram_gb": vram} | cell)
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def plots(sweep: Path) -> Path:
    out = sweep / "plots"
    assert plot_main([str(sweep), "--per-page", "5"]) == 0
    return out


def test_sweep_callback_writes_the_report_with_one_row_per_job_policy_seed(sweep: Path) -> None:
    results = pl.read_csv(sweep / "results.csv")
    cells = job_cells(sweep)
    assert results.height == cells.height == 4 * 3
    joined = results.join(cells, on=["job", "policy", "seed"], suffix="_job")
    assert joined.height == 12
    assert np.allclose(joined["realized_restore_s"], joined["realized_restore_s_job"])
    assert np.allclose(joined["vram_gb"], joined["vram_gb_job"])
    page = (sweep / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page and "https://" not in page
    md = (sweep / "report.md").read_text()
    assert "differ in vram_gb" in md and "| vram_gb | policy | seeds |" in md
    assert "cachepilot-sim --multirun" in md and "vram_gb=10,16" in md
    meta = json.loads((sweep / "sweep_meta.json").read_text())
    assert meta["differing_keys"] == ["vram_gb"] and meta["jobs_wall_s"] > 0
    assert {"python", "scipy", "polars"} <= set(meta["versions"]) and len(meta["jobs"]) == 4
    [trust] = meta["trust"]  # the four jobs share one engine and GPU: one label
    assert trust.startswith("engine default (roofline step cost)") and "unvalidated" in trust
    assert f"Trust: {trust}" in md.split("| vram_gb |")[0]


def test_headline_pools_two_seeds_per_configuration_with_the_t_interval(sweep: Path) -> None:
    data = pl.read_csv(sweep / "headline_by_config.csv")
    cells = job_cells(sweep)
    assert sorted(set(data["vram_gb"])) == [10.0, 16.0] and set(data["n"]) == {2}
    assert data.height == 2 * 3 * 3  # configurations x policies x metrics
    for row in data.filter(pl.col("metric") == "goodput_req_s").iter_rows(named=True):
        seeds = cells.filter(
            (pl.col("vram_gb") == row["vram_gb"]) & (pl.col("policy") == row["policy"])
        )["goodput_req_s"].to_numpy()
        assert seeds.size == 2 and row["mean"] == pytest.approx(seeds.mean())
        if seeds.std() > 0:
            low, _ = stats.t.interval(0.95, 1, loc=seeds.mean(), scale=stats.sem(seeds))
            assert row["ci95"] == pytest.approx(seeds.mean() - low)


def test_metric_vs_param_has_one_point_per_configuration_equal_to_the_jobs(plots: Path) -> None:
    data = pl.read_csv(plots / "realized_restore_s_vs_vram_gb.csv")
    cells = job_cells(plots.parent)
    assert data.height == 2 * 3 and set(data["n"]) == {2}
    for row in data.iter_rows(named=True):
        want = cells.filter(
            (pl.col("vram_gb") == row["vram_gb"]) & (pl.col("policy") == row["policy"])
        )["realized_restore_s"]
        assert row["mean"] == pytest.approx(want.mean())


def test_latency_cdfs_are_per_configuration_and_pool_the_seeds_requests(plots: Path) -> None:
    data = pl.read_csv(plots / "latency_cdfs.csv")
    cells = job_cells(plots.parent)
    ttft = data.filter(pl.col("metric") == "TTFT s")
    assert ttft.select("config", "policy").unique().height == 2 * 3
    for (config, policy), part in ttft.group_by("config", "policy"):
        vram = float(str(config).split("=")[1])
        completed = cells.filter((pl.col("vram_gb") == vram) & (pl.col("policy") == policy))
        assert part["n_seeds"][0] == 2
        assert part["n_requests"][0] == completed["completed"].sum()
        assert (part["ecdf"].diff().drop_nulls() >= 0).all() and part["ecdf"].max() == 1.0


def test_vram_pages_draw_every_trace_with_its_evictions(plots: Path) -> None:
    pages = sorted(plots.glob("vram_by_tier_p*of3.csv"))  # 12 traces, 5 per page
    assert len(pages) == 3 and all(p.with_suffix(".png").stat().st_size > 5000 for p in pages)
    data = pl.concat([pl.read_csv(p) for p in pages])
    assert data.select("config", "policy", "seed").unique().height == 12
    cells = job_cells(plots.parent)
    evictions = data.filter(pl.col("tier") == "eviction").group_by("config", "policy", "seed").len()
    for cell in cells.iter_rows(named=True):
        got = evictions.filter(
            (pl.col("config") == f"vram_gb={cell['vram_gb']}")
            & (pl.col("policy") == cell["policy"])
            & (pl.col("seed") == cell["seed"])
        )
        assert (got["len"][0] if got.height else 0) == cell["evictions"]


def test_gpu_and_cpu_tiers_have_their_own_axes_and_cdfs_are_log_with_distinct_styles(
    sweep: Path,
) -> None:
    traces, requests, _ = load_runs(sweep)
    fig, _ = vram_figure(traces[:2])
    gpu_ax, cpu_ax = fig.axes[0], fig.axes[1]
    assert not gpu_ax.get_shared_y_axes().joined(gpu_ax, cpu_ax)
    assert [line.get_label() for line in cpu_ax.get_lines()] == ["cpu", "flight"]
    fig, _ = latency_cdfs(requests)
    assert len(fig.axes) == 2 * 2 and {ax.get_xscale() for ax in fig.axes} == {"log"}
    lines = fig.axes[0].get_lines()
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in lines}) == len(lines) == 3
    assert all("n=2 seeds" in ln.get_label() for ln in lines)


@pytest.fixture(scope="module")
def two_configs(sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two seeds of vram_gb=10 whose configs differ in two other keys: two configurations."""
    parent = tmp_path_factory.mktemp("parent")
    for seed, edit in ((0, False), (1, True)):
        src = next(p.parent for p in sweep.glob(f"*seed={seed},*vram_gb=10,*/metrics.json"))
        dst = parent / f"run{seed}"
        shutil.copytree(src, dst)
        if edit:
            cfg = yaml.safe_load((dst / ".hydra" / "config.yaml").read_text())
            cfg["workload"]["spike_multiplier"] = 3.0
            cfg["workload"]["max_active_sessions"] = 6
            (dst / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return parent


def test_different_configurations_are_never_pooled_as_seeds(two_configs: Path) -> None:
    assert plot_main([str(two_configs), "--no-traces"]) == 0
    data = pl.read_csv(two_configs / "plots" / "headline_by_config.csv")
    assert data.select("config").n_unique() == 2 and set(data["n"]) == {1}


def test_a_facet_choice_that_would_pool_is_refused_naming_the_key(
    two_configs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = two_configs / "refused"
    assert plot_main([str(two_configs), "--facet", "workload.spike_multiplier", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "workload.max_active_sessions" in err
    assert "refusing to pool" in err and not out.exists()
    keep = ["--where", "workload.spike_multiplier=3.0", "--no-traces", "--out", str(out)]
    assert plot_main([str(two_configs), *keep]) == 0  # one configuration left: nothing pooled


def test_check_no_pooling_names_differing_keys_or_duplicate_jobs() -> None:
    frame = pl.DataFrame({"job": ["a", "b"], "policy": ["lru"] * 2, "seed": [0, 0], "k": [1, 2]})
    with pytest.raises(RunSetError, match="k differ"):
        check_no_pooling(frame, ["policy"], ["k"])
    with pytest.raises(RunSetError, match="appears twice \\(a, b\\)"):
        check_no_pooling(frame.with_columns(pl.lit(1).alias("k")), ["policy"], ["k"])
    check_no_pooling(frame, ["policy", "k"], ["k"])  # k as a facet: no pooling


def test_report_tool_on_a_parent_folder_and_refusal_on_a_run(
    two_configs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_main([str(two_configs)]) == 0
    table = (two_configs / "report.md").read_text()
    assert "| workload.max_active_sessions |" in table and "| workload.spike_multiplier |" in table
    assert report_main([str(two_configs / "run0")]) == 2
    assert "a run folder" in capsys.readouterr().err


def test_collect_plot_pools_only_seeds_and_writes_its_numbers(sweep: Path, tmp_path: Path) -> None:
    from cachepilot_sim.tools.collect import collect

    result = collect(sweep, tmp_path, metric="goodput_req_s", param="vram_gb")
    data = pl.read_csv(result["plot"].with_suffix(".csv"))
    assert data.height == 2 * 3 and set(data["n"]) == {2}
    cells = job_cells(sweep)
    for row in data.iter_rows(named=True):
        want = cells.filter(
            (pl.col("vram_gb") == row["vram_gb"]) & (pl.col("policy") == row["policy"])
        )["goodput_req_s"]
        assert row["mean"] == pytest.approx(want.mean())


def test_runs_without_a_saved_config_compare_by_overrides_and_bad_files_are_named(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in sorted(sweep.glob("*seed=0,*/metrics.json")):  # vram_gb=10 and 16, seed 0
        shutil.copytree(path.parent, tmp_path / path.parent.name)
    first = sorted(tmp_path.iterdir())[0]
    (first / ".hydra" / "config.yaml").unlink()
    (first / "run_meta.json").unlink()
    assert plot_main([str(tmp_path), "--no-traces"]) == 0
    data = pl.read_csv(tmp_path / "plots" / "headline_by_config.csv")
    assert sorted(set(data["config"])) == ["vram_gb=10", "vram_gb=16"] and set(data["n"]) == {1}
    shutil.rmtree(tmp_path / "plots")
    (first / "metrics.json").write_text('{"cells": [')
    assert plot_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(first / "metrics.json") in err
    assert not (tmp_path / "plots").exists()
    assert report_main([str(tmp_path)]) == 2 and not (tmp_path / "report.md").exists()
