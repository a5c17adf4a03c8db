"""A run owns its output folder (issue 15): a rerun removes what the earlier run wrote, readers
refuse parts and trace folders that belong to another run, and metrics.json is strict JSON."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.config import RunConfig, SimConfig
from cachepilot_sim.experiment.outdir import OutputDirError
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.tools.figures import load_runs
from cachepilot_sim.tools.plot import main as plot_main
from cachepilot_sim.trace.derive import TraceError, load_trace
from tests.conftest import make_sim_config, make_workload


def tiny_config(policies: list[str], seeds: int = 1, **sim: Any) -> RunConfig:
    cfg = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=40), **sim)
    values = {f.name: getattr(cfg, f.name) for f in fields(SimConfig)}
    return RunConfig(**values | {"seeds": seeds, "jobs": 1}, compare_policies=policies)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of two policies; tests copy it instead of running again."""
    out = tmp_path_factory.mktemp("first") / "run"
    run_experiment(tiny_config(["perc", "lru"], seeds=2), out)
    return out


def _copy(first_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    return out


def test_rerun_with_other_policies_leaves_only_its_own_cells(first_run: Path, tmp_path: Path):
    out = _copy(first_run, tmp_path)
    report = run_experiment(tiny_config(["lru"]), out)
    assert sorted(p.name for p in (out / "trace").iterdir()) == ["lru_seed0"]
    assert sorted(p.name for p in (out / "requests").iterdir()) == ["lru_seed0.parquet"]
    traces, requests, _ = load_runs(out)
    assert len(traces) == 1 and requests["policy"].unique().to_list() == ["lru"]
    assert json.loads((out / "metrics.json").read_text())["run_id"] == report["run_id"]


def test_equal_configs_give_equal_run_ids_and_outputs(first_run: Path, tmp_path: Path) -> None:
    out = _copy(first_run, tmp_path)
    before = (out / "metrics.json").read_text()
    run_experiment(tiny_config(["perc", "lru"], seeds=2), out)
    assert (out / "metrics.json").read_text() == before


STALE_PARTS = ["part-00007.parquet", "part-99999.parquet", "part-00000x.parquet"]


@pytest.mark.parametrize("name", STALE_PARTS)
def test_a_part_from_another_run_is_refused(first_run: Path, tmp_path: Path, name: str) -> None:
    out = _copy(first_run, tmp_path)
    trace = out / "trace" / "perc_seed0"
    shutil.copy(trace / "part-00000.parquet", trace / name)
    with pytest.raises(TraceError, match=f"{name} is not among this run's parts"):
        load_trace(trace)
    assert plot_main([str(out)]) == 2


@pytest.mark.parametrize("cell", ["perc_seed7", "belady_seed0", "lru_seed2"])
def test_a_trace_folder_of_another_run_is_refused(first_run: Path, tmp_path: Path, cell: str):
    out = _copy(first_run, tmp_path)
    shutil.copytree(out / "trace" / "lru_seed0", out / "trace" / cell)
    with pytest.raises(TraceError, match=f"{cell}: not a cell of the run"):
        load_runs(out)


def test_a_listed_part_that_is_gone_is_named(first_run: Path, tmp_path: Path) -> None:
    out = _copy(first_run, tmp_path)
    (out / "trace" / "lru_seed1" / "part-00000.parquet").rename(out / "elsewhere.parquet")
    with pytest.raises(TraceError, match="lru_seed1: meta.json but no part|listed but missing"):
        load_trace(out / "trace" / "lru_seed1")


@pytest.mark.parametrize("content", [b"", b"PAR1", b"PAR1" + bytes(100), b"not parquet at all"])
def test_a_truncated_part_is_one_line_for_plot(
    first_run: Path, tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _copy(first_run, tmp_path)
    part = out / "trace" / "perc_seed1" / "part-00000.parquet"
    part.write_bytes(content)
    assert plot_main([str(out)]) == 2
    err = capsys.readouterr().err
    assert "part-00000.parquet" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "folder", ["compare_policies=[perc]", "x=[a,b]", "seed={1,2}", "p=*", "q=?", "r=[!x]"]
)
def test_folder_names_with_glob_characters_are_paths(
    first_run: Path, tmp_path: Path, folder: str
) -> None:
    out = tmp_path / folder
    shutil.copytree(first_run, out)
    lf, meta = load_trace(out / "trace" / "perc_seed0")
    assert lf.select(pl.len()).collect().item() > 0 and meta["policy"] == "perc"
    assert len(load_runs(out)[0]) == 4


def test_metrics_json_is_strict_json_with_null_for_no_value(first_run: Path) -> None:
    text = (first_run / "metrics.json").read_text()

    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in metrics.json")

    report = json.loads(text, parse_constant=refuse)
    perc = [c for c in report["cells"] if c["policy"] == "perc"]
    assert all(c["restore_vs_lru"] is not None for c in perc)
    only_perc = json.loads(text)
    assert only_perc["run_id"]


def test_without_lru_the_ratio_is_null(tmp_path: Path) -> None:
    run_experiment(tiny_config(["perc"]), tmp_path / "r")
    report = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert report["cells"][0]["restore_vs_lru"] is None


@pytest.mark.parametrize("kind", ["file", "under_file"])
def test_an_unusable_output_folder_is_named(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = blocker if kind == "file" else blocker / "run"
    with pytest.raises(OutputDirError, match=str(blocker)):
        run_experiment(tiny_config(["lru"]), out)
    assert blocker.read_text() == "x"


def test_other_files_in_the_folder_are_left_alone(first_run: Path, tmp_path: Path) -> None:
    out = _copy(first_run, tmp_path)
    (out / "notes.txt").write_text("mine")
    (out / "trace" / "notes.txt").write_text("mine too")
    run_experiment(tiny_config(["lru"]), out)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "trace" / "notes.txt").read_text() == "mine too"
