"""A real run on two spawn workers is stopped by a signal: no worker outlives it, no half-written
file is left, and a rerun into the same folder heals it (issue 15)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.tools.figures import load_runs

RUN = ["workload.num_requests=4000", "seeds=2", "jobs=2", "trace.chunk_rows=20000"]


def _workers(pid: int) -> list[int]:
    """Child processes of `pid` running a multiprocessing worker."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"multiprocessing" in cmd or b"spawn_main" in cmd:
                found.append(int(child))
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cachepilot_sim", *RUN, f"hydra.run.dir={out}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.exclusive
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGKILL, -9)],
)
def test_a_stopped_run_leaves_no_orphan_no_partial_file_and_a_rerun_heals(
    tmp_path: Path, signum: int, status: int
) -> None:
    out = tmp_path / "run"
    proc = _start(out)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while time.monotonic() < deadline and len(workers) < 3:
        workers = _workers(proc.pid)
        time.sleep(0.2)
    time.sleep(1.5)  # the workers are simulating
    workers = _workers(proc.pid) or workers
    assert len(workers) >= 2, "the run did not start its workers"  # + resource tracker
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err[-2000:]
    if signum != signal.SIGKILL:
        assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err
    time.sleep(2.0)  # the watchdog polls every 0.5 s
    assert [w for w in workers if _alive(w)] == []
    # A file cut short can only be a *.tmp (never read; the rerun removes it): every file under
    # its real name was renamed into place when complete.
    for part in out.rglob("*.parquet"):
        pl.read_parquet(part)
    assert not (out / "metrics.json").exists()
    rerun = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "workload.num_requests=200",
            "seeds=1",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert list(out.rglob("*.tmp")) == []
    traces, requests, _ = load_runs(out)
    assert len(traces) == 1 and requests.height > 0  # perc, seed 0: nothing of the stopped run


def test_a_worker_that_starts_after_its_parent_died_exits(tmp_path: Path) -> None:
    """A pool worker still starting when its parent is killed is reparented before it installs
    its watchdog: given the pool's pid, it exits at once (it used to watch its new parent and
    live on; such orphans were left by the SIGKILL test on a loaded machine)."""
    started, failed = tmp_path / "started", tmp_path / "failed"
    worker = (
        "import sys, time; time.sleep(1.5); "
        "from cachepilot_sim.experiment.lifecycle import exit_with_parent; "
        f"open({str(started)!r}, 'w').close()\n"
        f"try:\n exit_with_parent(int(sys.argv[1]))\n"
        f"except Exception:\n open({str(failed)!r}, 'w').close(); raise\n"
        "time.sleep(120)"
    )
    parent = (
        "import os, subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {worker!r}, str(os.getpid())], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True
    )
    child = int(out.stdout)  # its parent has exited: the worker is reparented while it sleeps
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), "the orphaned worker is still running"
    assert started.exists() and not failed.exists()  # its watchdog ended it


@pytest.mark.exclusive
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_ctrl_c_or_closed_terminal_stops_a_run_without_a_worker_traceback(
    tmp_path: Path, signum: int, status: int
) -> None:
    """Ctrl-C and a closed terminal reach the whole process group (issue 30, item 5): the cell
    workers leave the stop to the run, which stops them: one line, no traceback per worker, no
    worker left."""
    out = tmp_path / "run"
    proc = subprocess.Popen(  # its own process group, as a shell job
        [sys.executable, "-m", "cachepilot_sim", *RUN, f"hydra.run.dir={out}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 3:
            workers = _workers(proc.pid)
            time.sleep(0.2)
        time.sleep(1.5)  # the workers are simulating
        workers = _workers(proc.pid) or workers
        assert len(workers) >= 2, "the run did not start its workers"
        os.killpg(proc.pid, signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert f"stopped by {signal.Signals(signum).name}" in err, err[-2000:]
    assert len(err.strip().splitlines()) == 1, err[-2000:]
    time.sleep(2.0)  # the watchdog polls every 0.5 s
    assert [w for w in workers if _alive(w)] == []
    assert not (out / "metrics.json").exists()
