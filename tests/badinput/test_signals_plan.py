"""A plan stopped by a signal (issue 30): SIGINT, SIGTERM and SIGHUP end it with one line and
128 + the signal, no worker traceback on the terminal, no worker process left, nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLAN_YAML = """\
name: stopped
simulation:
  - +experiment=azure_conv
  - replay.path=samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv
  - replay.limit=400
sla: {ttft_p99_s: 2.0, tpot_p99_ms: 50.0, goodput_fraction: 0.95}
space:
  gpus: [h200, l40s, h100_sxm]
  policies: [perc, lru]
  max_replicas: 16
jobs: 2
"""


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(c) for c in task.read_text().split()]
            except OSError:
                continue
            todo += [k for k in kids if k not in found]
            found.update(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _wait(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.exclusive
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stopped_plan_leaves_no_worker_and_no_traceback(tmp_path: Path, signum: int) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN_YAML)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "cachepilot_sim.tools.plan", "--config", str(path), "--out",
           str(out)]  # fmt: skip
    # its own process group, as a shell job: a terminal's Ctrl-C or hang-up reaches every member
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert _wait(lambda: len(_descendants(proc.pid)) >= 2, 120), "no workers started"
        time.sleep(1.0)  # the workers are simulating
        workers = _descendants(proc.pid)
        if signum == signal.SIGTERM:
            os.kill(proc.pid, signum)  # `kill PID`: the planner only
        else:
            os.killpg(proc.pid, signum)  # Ctrl-C, closed terminal: the whole group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert signal.Signals(signum).name in err
    assert _wait(lambda: not any(_alive(w) for w in workers), 15), [w for w in workers if _alive(w)]
    assert not out.exists()
