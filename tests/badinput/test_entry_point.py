"""What `cachepilot-sim` refuses before Hydra makes the run folder (issue 15): an unusable
`hydra.run.dir` or `hydra.sweep.dir`, a missing trace or learned-weights file, a bad config value,
and the overrides Hydra itself rejects (a key the chosen group option lacks, an unknown option, a
value of the wrong type, a line it cannot parse). Each is one line on stderr naming the key or
path, exit 2, no traceback, and nothing is written: an earlier run's folder stays byte for byte.

In-process through the entry point (`__main__.main`, as the console command calls it), and one
case as a real subprocess to see the whole stderr of the command.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachepilot_sim.__main__ import main

SMALL = ["workload.num_requests=20", "seeds=1", "jobs=1"]


def _refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> str:
    """Run the entry point; assert exit 2 and one line on stderr; return that line."""
    monkeypatch.setattr(sys, "argv", ["cachepilot-sim", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("CACHEPILOT_TRACEBACK", raising=False)
    # main() installs SIGTERM/SIGHUP handlers: give pytest its own back.
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachepilot_sim: "), err
    assert "Traceback" not in err and "HYDRA_FULL_ERROR" not in err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    """A folder holding an earlier run's results (what a refused run must not touch)."""
    out = tmp_path / "earlier"
    (out / "trace" / "perc_seed0").mkdir(parents=True)
    (out / "metrics.json").write_text('{"cells": []}')
    (out / "run.json").write_text('{"run_id": "abc", "cells": ["perc_seed0"]}')
    (out / "trace" / "perc_seed0" / "part-00000.parquet").write_bytes(b"PAR1")
    return out


def _bad_run_dirs(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    return {
        "under a file": a_file / "run",
        "deep under a file": a_file / "x" / "y" / "run",
        "is a file": a_file,
        "cannot be made (procfs)": Path("/proc/self/cachepilot_run"),
    }


@pytest.mark.parametrize(
    "case", ["under a file", "deep under a file", "is a file", "cannot be made (procfs)"]
)
def test_an_unusable_run_dir_is_one_line_naming_the_key_and_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    run_dir = _bad_run_dirs(tmp_path)[case]
    line = _refused(monkeypatch, capsys, *SMALL, f"hydra.run.dir={run_dir}")
    assert f"hydra.run.dir={run_dir}" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing made


def test_an_unusable_sweep_dir_is_one_line_naming_the_key_and_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = _bad_run_dirs(tmp_path)["under a file"]
    line = _refused(
        monkeypatch, capsys, "--multirun", *SMALL, "seed=0,1", f"hydra.sweep.dir={sweep_dir}"
    )
    assert f"hydra.sweep.dir={sweep_dir}" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def _bad_weights(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not an npz")
    other = tmp_path / "other.npz"
    np.savez(other, w1=np.zeros((2, 2)), b1=np.zeros(2), w2=np.zeros((2, 3)), b2=np.zeros(3))
    other.with_suffix(".json").write_text('{"features": ["a", "b"]}')
    return {
        "missing": (tmp_path / "nope.npz", "No such file"),
        "not an npz": (garbage, "unreadable"),
        "other features": (other, "trained on features"),
    }


@pytest.mark.parametrize("case", ["missing", "not an npz", "other features"])
def test_bad_learned_weights_are_refused_before_the_folder_is_claimed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    earlier_run: Path,
    case: str,
) -> None:
    weights, reason = _bad_weights(tmp_path)[case]
    before = _snapshot(earlier_run)
    line = _refused(
        monkeypatch, capsys, *SMALL, "admission=learned", f"admission.weights={weights}",
        f"hydra.run.dir={earlier_run}",
    )  # fmt: skip
    assert "admission.weights" in line and str(weights) in line and reason in line
    assert _snapshot(earlier_run) == before and not (earlier_run / ".hydra").exists()


def test_bad_weights_into_a_new_folder_make_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "new" / "run"
    _refused(
        monkeypatch, capsys, *SMALL, "admission=learned",
        f"admission.weights={tmp_path / 'nope.npz'}", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert not (tmp_path / "new").exists()


def test_a_missing_trace_file_is_refused_before_the_folder_is_claimed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    earlier_run: Path,
) -> None:
    before = _snapshot(earlier_run)
    trace = tmp_path / "nope.jsonl"
    line = _refused(
        monkeypatch, capsys, *SMALL, "replay.format=MOONCAKE", f"replay.path={trace}",
        f"hydra.run.dir={earlier_run}",
    )  # fmt: skip
    assert f"{trace}: no such trace file" in line
    assert _snapshot(earlier_run) == before and not (earlier_run / ".hydra").exists()


# Overrides that Hydra or the config refuses: (overrides, what the one line must name).
BAD_OVERRIDES = [
    (["policy=lru", "policy.flop_weight=9"], "policy.flop_weight"),
    (["policy.nonsense=1"], "policy.nonsense"),
    (["foo=1"], "foo"),
    (["workload.classes.nope.weight=1"], "nope"),
    (["seed=abc"], "seed"),
    (["vram_gb=lots"], "vram_gb"),
    (["replay.format=mooncake"], "replay.format"),
    (["policy=nosuch"], "policy/nosuch"),
    (["model=nosuch"], "model/nosuch"),
    (["+experiment=nosuch"], "experiment/nosuch"),
    (["seed=["], "seed=["),
    (["vram_gb=nan"], "vram_gb"),
    (["+foo=1"], "foo"),
    (["compare_policies=[lru]", "policy=perc"], "compare_policies"),
]


@pytest.mark.parametrize(("overrides", "named"), BAD_OVERRIDES, ids=lambda v: str(v))
def test_a_refused_override_is_one_line_naming_the_key_and_nothing_is_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    named: str,
) -> None:
    run_dir = tmp_path / "run"
    line = _refused(monkeypatch, capsys, *SMALL, *overrides, f"hydra.run.dir={run_dir}")
    assert named in line and "invalid configuration" in line
    assert not run_dir.exists()


def test_the_group_options_are_listed_on_the_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused(monkeypatch, capsys, "policy=nosuch", f"hydra.run.dir={tmp_path / 'r'}")
    assert "options in 'policy': " in line and "lru, " in line and "perc" in line


def test_the_command_prints_one_line_for_a_key_the_policy_lacks(tmp_path: Path) -> None:
    """The console command end to end: no Hydra block, exit 2, nothing made."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", "policy=lru", "policy.flop_weight=9",
         f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "policy.flop_weight" in proc.stderr, proc.stderr
    assert proc.stdout == "" and not run_dir.exists()


def test_hydra_full_error_keeps_hydras_own_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switch Hydra documents still shows the whole exception to whoever asks for it."""
    monkeypatch.setattr(sys, "argv", ["cachepilot-sim", "policy=lru", "policy.flop_weight=9"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(Exception, match="Could not override 'policy.flop_weight'"):
            main()
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
