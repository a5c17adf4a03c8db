"""Tiny example folders: what the notebooks simulate when no folder is given, and what their
test (tests/unit/test_notebooks.py) hands them. One run of two policies, and a sweep of 8 jobs
(policy x vram_gb x seed) on the joblib launcher."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

# The tiny sweep's overrides: 2 policies x 2 VRAM sizes x 2 seeds, one seed per job.
SWEEP_OVERRIDES = [
    "policy=perc,lru",
    "vram_gb=10,16",
    "seed=0,1",
    "seeds=1",
    "workload.num_requests=20",
    "workload.max_active_sessions=4",
    "hydra.launcher.n_jobs=2",
]


def tiny_run(run_dir: Path, num_requests: int = 50) -> Path:
    """Simulate PERC and LRU on `num_requests` requests of the default workload into run_dir."""
    from cachepilot_sim.config import RunConfig, SimConfig
    from cachepilot_sim.experiment.runner import run_experiment

    base = SimConfig(vram_gb=10.0)
    values = {f.name: getattr(base, f.name) for f in fields(SimConfig)}
    values["workload"] = type(base.workload)(num_requests=num_requests, max_active_sessions=8)
    run_experiment(RunConfig(**values, compare_policies=["perc", "lru"]), run_dir)
    return run_dir


def tiny_sweep(sweep_dir: Path) -> Path:
    """Run the 8-job `--multirun` of SWEEP_OVERRIDES into sweep_dir; a failed sweep raises
    with the end of its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", "--multirun", *SWEEP_OVERRIDES,
         f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the tiny sweep failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return sweep_dir
