"""A real `--multirun` sweep on the joblib launcher (two loky workers) is stopped by SIGTERM or
SIGHUP: the command says so in one line and exits 128 + signal, no process it started outlives
it, every file under the sweep folder is whole (JSON parses, parquet reads; only `*.tmp` can be
cut short), and a rerun with the same `hydra.sweep.dir` finishes every job (issue 15)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from tests.badinput.test_signals import _alive

JOBS = ["seed=0,1,2,3"]
SWEEP = ["workload.num_requests=8000", "seeds=1", "jobs=1", "hydra.launcher.n_jobs=2"]


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = {int(c) for c in task.read_text().split()}
            except OSError:
                continue
            todo += sorted(kids - found)
            found |= kids
    return found


def _sweep(sweep_dir: Path) -> list[str]:
    return [sys.executable, "-m", "cachepilot_sim", "--multirun", *JOBS, *SWEEP,
            f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip


def _running_jobs(sweep_dir: Path) -> int:
    return sum('"running"' in p.read_text() for p in sweep_dir.glob("*/job.json") if p.is_file())


@pytest.mark.exclusive
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopped_sweep_leaves_no_orphan_no_partial_file_and_a_rerun_heals(
    tmp_path: Path, signum: int, status: int
) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        _sweep(sweep_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    started: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        started |= _descendants(proc.pid)
        if sweep_dir.is_dir() and _running_jobs(sweep_dir) >= 2:
            break
        time.sleep(0.2)
    # Both workers have started: signal while a job is simulating (a job takes seconds here, and
    # the launcher may sit between two jobs for a moment, so look again rather than sleep once).
    time.sleep(0.5)
    while time.monotonic() < deadline and proc.poll() is None and _running_jobs(sweep_dir) < 1:
        time.sleep(0.05)
    started |= _descendants(proc.pid)
    assert proc.poll() is None and _running_jobs(sweep_dir) >= 1, "the sweep ended too soon"
    assert len(started) >= 2, "the launcher did not start its workers"
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-3000:]
    name = signal.Signals(signum).name
    assert f"stopped by {name}" in err and "Traceback" not in err, err[-3000:]
    # A worker's watchdog polls its parent every 0.5 s: every process is gone within 2 s.
    gone_by = time.monotonic() + 2.0
    while any(_alive(p) for p in started) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert sorted(p for p in started if _alive(p)) == []
    # Whole files only: every JSON parses, every parquet reads (a cut file can only be *.tmp).
    for path in sweep_dir.rglob("*.json"):
        json.loads(path.read_text())
    for path in sweep_dir.rglob("*.parquet"):
        pl.read_parquet(path)
    rerun = subprocess.run(_sweep(sweep_dir), capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads((sweep_dir / "sweep_status.json").read_text())
    assert len(report["complete"]) == 4 and report["failed"] == report["incomplete"] == []
    assert list(sweep_dir.rglob("*.tmp")) == []
    for job in report["complete"]:
        cells = json.loads((sweep_dir / job["dir"] / "metrics.json").read_text())["cells"]
        assert len(cells) == 1 and cells[0]["requests"] > 0


@pytest.mark.exclusive
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_ctrl_c_or_closed_terminal_stops_a_sweep_without_a_worker_traceback(
    tmp_path: Path, signum: int, status: int
) -> None:
    """Ctrl-C and a closed terminal reach the whole process group, workers included (issue 30,
    item 5): the workers leave the stop to the sweep, which stops them, so the terminal shows
    the sweep's one line, not a KeyboardInterrupt traceback per worker, and no process is left
    (loky's resource tracker included)."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(  # its own process group, as a shell job
        _sweep(sweep_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        started: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            started |= _descendants(proc.pid)
            if sweep_dir.is_dir() and _running_jobs(sweep_dir) >= 2:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # both workers are simulating
        started |= _descendants(proc.pid)
        assert proc.poll() is None and len(started) >= 2, "the sweep ended too soon"
        os.killpg(proc.pid, signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in err, err[-3000:]
    gone_by = time.monotonic() + 5.0
    while any(_alive(p) for p in started) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert sorted(p for p in started if _alive(p)) == []
