"""The timing harness the speed benchmarks share (bench_sim_speed.py, bench_cluster.py): run one
case in a fresh subprocess (so that its peak RSS is its own), compose its Hydra config there, run
its cells with files written to a temporary folder, count SimPy events, and say when, on which
commit and under what load it ran.

A benchmark script calls `child_or_none()` first (it returns the overrides when the script was
started as a case's child, after which the script prints `json.dumps(time_case(...))`), and
`run_child(__file__, overrides)` to run a case.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import simpy

CHILD_FLAG = "--child"


def child_or_none() -> list[str] | None:
    """The case's overrides when this process is a benchmark's child, else None."""
    if CHILD_FLAG not in sys.argv:
        return None
    return sys.argv[sys.argv.index(CHILD_FLAG) + 1 :]


def run_child(script: str, overrides: list[str]) -> dict[str, Any]:
    """Run `script` as a child on `overrides`; the figures it printed last (JSON)."""
    proc = subprocess.run(
        [sys.executable, script, CHILD_FLAG, *overrides], capture_output=True, text=True, check=True
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def time_case(overrides: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """In the child: compose the config, run its cells (files written), and return the cells and
    wall and CPU seconds, SimPy events and process resumes (counted in this process only: not in
    cells that ran on worker processes) and this process's peak RSS."""
    from hydra import compose, initialize_config_dir

    from cachepilot_sim.config import register_configs, to_config
    from cachepilot_sim.experiment.runner import run_cells

    num_events = num_resumes = 0
    schedule = simpy.Environment.schedule
    resume = simpy.events.Process._resume

    def counting(self, event, priority=1, delay=0):  # noqa: ANN001, ANN202
        nonlocal num_events
        num_events += 1
        return schedule(self, event, priority, delay)

    def counting_resume(self, event):  # noqa: ANN001, ANN202
        nonlocal num_resumes
        num_resumes += 1
        return resume(self, event)

    simpy.Environment.schedule = counting  # type: ignore[method-assign]
    simpy.events.Process._resume = counting_resume  # type: ignore[method-assign]
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=overrides))
    with tempfile.TemporaryDirectory() as out:
        start, cpu0 = time.perf_counter(), time.process_time()
        cells = run_cells(cfg, Path(out))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    num_requests = sum(c["requests"] for c in cells)
    in_process = cfg.jobs == 1 or len(cells) == 1
    return cells, {
        "runs": len(cells),
        "simulated_requests": num_requests,
        "wall_s": wall,
        # CPU seconds of this process: on a shared machine wall time also counts other users.
        "cpu_s": cpu,
        "requests_per_wall_s": num_requests / wall,
        "requests_per_cpu_s": num_requests / cpu,
        "simpy_events": num_events if in_process else None,
        "events_per_wall_s": num_events / wall if in_process else None,
        "process_resumes": num_resumes if in_process else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_meta() -> dict[str, Any]:
    """When, on which commit, machine and load a benchmark ran."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
        "commit": commit,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "load_avg_1_5_15": list(os.getloadavg()),
    }
