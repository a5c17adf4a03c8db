"""Sweep job folders never leave the sweep folder, and the summary counts every launched job
(issue 15)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot_sim.experiment.sweep import LAUNCH_DIR, safe_dirname, sweep_status

HOSTILE_NAMES = [
    "replay.path=../x",
    "replay.path=../../../../etc",
    "replay.path=/abs/path",
    "a=..",
    "..",
    ".",
    "a=b/c,d=../e",
    "x=%2F",
    "x=%",
    "p=a\\b",
    "p=\x00",
    "compare_policies=[perc,lru]",
    "seed={1,2}",
    "k=" + "v" * 300,
    "k=" + "/" * 120,
    "",
    "~policy",
    "+foo=1",
    "name=a b",
    "x=\u00e9/../\u00e9",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_job_folder_name_stays_one_folder_inside_the_sweep(tmp_path: Path, name: str) -> None:
    out = safe_dirname(name)
    assert "/" not in out and "\x00" not in out and out not in (".", "..")
    assert len(out) <= 200
    job = (tmp_path / out).resolve() if out else tmp_path.resolve()
    assert job == tmp_path.resolve() or job.parent == tmp_path.resolve()


def test_distinct_overrides_give_distinct_folders() -> None:
    names = ["x=a/b", "x=a%2Fb", "x=a%252Fb", "k=" + "v" * 300, "k=" + "v" * 301]
    assert len({safe_dirname(n) for n in names}) == len(names)


def _launch(sweep: Path, num: int, job_dir: Path, status: str) -> None:
    (sweep / LAUNCH_DIR).mkdir(parents=True, exist_ok=True)
    record = {"job": num, "dir": str(job_dir), "status": status, "overrides": [f"n={num}"]}
    (sweep / LAUNCH_DIR / f"{num}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("status", ["running", "failed", "complete", "skipped"])
def test_a_launched_job_without_its_folder_is_counted_failed(tmp_path: Path, status: str) -> None:
    sweep = tmp_path / "s"
    _launch(sweep, 0, tmp_path / "elsewhere", status)
    result = sweep_status(sweep)
    assert [e["dir"] for e in result["failed"]] == [str(tmp_path / "elsewhere")]


def test_an_unreadable_launch_record_is_counted_failed(tmp_path: Path) -> None:
    (tmp_path / LAUNCH_DIR).mkdir()
    (tmp_path / LAUNCH_DIR / "3.json").write_text("{")
    assert "unreadable launch record" in sweep_status(tmp_path)["failed"][0]["error"]


def test_a_job_folder_outside_the_sweep_fails_and_the_sweep_exits_non_zero(tmp_path: Path):
    sweep = tmp_path / "s"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "--multirun",
            "seed=1,2",
            "hydra.sweep.subdir=../out${hydra.job.num}",
            "workload.num_requests=20",
            "workload.max_active_sessions=4",
            "seeds=1",
            "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "0 jobs complete, 2 failed, 0 incomplete" in proc.stdout
    assert "outside the sweep folder" in proc.stderr
    assert not (tmp_path / "out0" / "metrics.json").exists()
