"""Bad arguments and corrupt inputs of the tools (collect, plot, train_admission, telemetry): exit 2
with one line naming the argument or file, nothing written, no column silently retyped (issue 15).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.telemetry import main as telemetry_main
from cachepilot_sim.tools.collect import main as collect_main
from cachepilot_sim.tools.plot import main as plot_main
from cachepilot_sim.tools.train_admission import SHIPPED_WEIGHTS, parse
from tests.badinput.test_output_folders import tiny_config


@pytest.fixture(scope="module")
def fake_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three complete jobs (vram_gb=10,12,14) made from one tiny run's metrics.json."""
    root = tmp_path_factory.mktemp("sweep")
    run_experiment(tiny_config(["perc", "lru"]), root / "run")
    report = json.loads((root / "run" / "metrics.json").read_text())
    for gb in (10, 12, 14):
        job = root / "s" / f"vram_gb={gb}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- vram_gb={gb}\n")
        (job / "job.json").write_text(json.dumps({"status": "complete"}))
        (job / "metrics.json").write_text(json.dumps(report))
    return root / "s"


CORRUPT_CELLS = {
    "nan_literal": ('"evictions": 3', '"evictions": NaN', None),
    "string": ('"evictions": 3', '"evictions": "many"', "cells[0].evictions"),
    "list": ('"evictions": 3', '"evictions": [1]', "cells[0].evictions"),
    "object": ('"evictions": 3', '"evictions": {"a": 1}', "cells[0].evictions"),
    "bool_policy": ('"policy": "perc"', '"policy": true', "cells[0].policy"),
    "infinity": ('"evictions": 3', '"evictions": Infinity', None),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_CELLS))
def test_collect_never_turns_a_metric_column_into_text(
    fake_sweep: Path, tmp_path: Path, case: str
) -> None:
    sweep = tmp_path / "s"
    shutil.copytree(fake_sweep, sweep)
    path = sweep / "vram_gb=12" / "metrics.json"
    report = json.loads(path.read_text())
    report["cells"][0]["evictions"] = 3
    old, new, named = CORRUPT_CELLS[case]
    path.write_text(json.dumps(report).replace(old, new, 1))
    assert collect_main([str(sweep)]) == 0
    table = pl.read_parquet(sweep / "collected.parquet")
    assert table["evictions"].dtype.is_numeric()
    jobs = pl.read_csv(sweep / "jobs.csv")
    if named is None:  # NaN/Infinity from older runs: read as null, job kept
        assert table.height == 6 and table["evictions"].null_count() == 1
    else:
        bad = jobs.filter(pl.col("status") == "unreadable")
        assert bad.height == 1 and named in bad["error"][0] and str(path) in bad["error"][0]
        assert table.height == 4


CORRUPT_FILES = [b"", b"{", b"\x00\xff\xfe", b"[]", b'{"cells": {}}', b'{"cells": [1]}', b"null"]


@pytest.mark.parametrize("content", CORRUPT_FILES)
def test_collect_names_an_unreadable_metrics_file(
    fake_sweep: Path, tmp_path: Path, content: bytes
) -> None:
    sweep = tmp_path / "s"
    shutil.copytree(fake_sweep, sweep)
    (sweep / "vram_gb=10" / "metrics.json").write_bytes(content)
    assert collect_main([str(sweep)]) == 0
    jobs = pl.read_csv(sweep / "jobs.csv")
    assert jobs.filter(pl.col("status") == "unreadable")["job"].to_list() == ["vram_gb=10"]


@pytest.mark.parametrize("kind", ["file", "under_file"])
def test_collect_to_an_unwritable_out_is_one_line(
    fake_sweep: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = blocker if kind == "file" else blocker / "out"
    assert collect_main([str(fake_sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [["/nonexistent/sweep"], ["--format", "gif", "."], [], ["--metric"]],
)
def test_collect_bad_arguments_exit_2(argv: list[str]) -> None:
    try:
        code = collect_main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2


@pytest.mark.parametrize(
    "argv", [["/nonexistent/run"], ["--format", "pdf", "."], [], ["--out"], ["a", "b"]]
)
def test_plot_bad_arguments_exit_2(argv: list[str]) -> None:
    try:
        code = plot_main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2


@pytest.mark.parametrize("argv", [["prometheus"], [], ["grafana", "--out"]])
def test_telemetry_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        telemetry_main(argv)
    assert exc.value.code == 2


def test_telemetry_unwritable_out_is_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    (tmp_path / "f").write_text("x")
    assert telemetry_main(["grafana", "--out", str(tmp_path / "f" / "d.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Traceback" not in err


OK_OUT = ["--out", "{tmp}/w.npz"]
BAD_TRAIN_ARGS = [
    (flag, value)
    for flag, values in {
        "--seed": ["-1", "x", "1.5", ""],
        "--train-seeds": ["0", "-2", "x", "2.0"],
        "--episode-requests": ["0", "-1", "1e3", "many"],
        "--imitation-epochs": ["-1", "x", "0.5"],
        "--iterations": ["0", "-1", "x"],
        "--episodes": ["1", "0", "-4", "x"],
        "--eval-every": ["0", "-1", "x"],
        "--hidden": ["0", "-3", "x", "4.5"],
        "--lr": ["0", "-0.1", "nan", "inf", "-inf", "x", ""],
        "--experiment": ["nope", "../config", "", "smoke.yaml"],
    }.items()
    for value in values
]


@pytest.mark.parametrize(("flag", "value"), BAD_TRAIN_ARGS)
def test_train_admission_refuses_each_bad_argument(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--out", str(tmp_path / "w.npz"), flag, value])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _shipped() -> str:
    return str(SHIPPED_WEIGHTS[0]) if SHIPPED_WEIGHTS else "experiments/admission/weights.npz"


@pytest.mark.parametrize(
    "out",
    ["", "shipped", "{tmp}", "{tmp}/w.txt", "{tmp}/file/x/w.npz", "{tmp}/file/w.npz", None],
)
def test_train_admission_out_is_required_new_and_writable(
    tmp_path: Path, out: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    argv = [] if out is None else ["--out", _shipped() if out == "shipped" else out]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} == before


def test_shipped_weights_are_known() -> None:
    assert any(p.name == "weights.npz" for p in SHIPPED_WEIGHTS)
