"""Optional: the sweep through Hydra's Submitit launcher in local mode (the Slurm launcher's code
path without a cluster). Needs the `slurm` extra; skipped, saying so, without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher",
    reason="hydra-submitit-launcher is an optional extra: pip install -e '.[slurm]'",
)


@pytest.mark.slow
def test_sweep_runs_through_the_submitit_launcher(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "--multirun",
            "hydra/launcher=submitit_local",
            "policy=perc,lru",
            "vram_gb=16,8",
            "seeds=1",
            "workload.num_requests=20",
            "workload.max_active_sessions=4",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # vram_gb=8 cannot hold the model: isolated and reported as with joblib.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "2 jobs complete, 2 failed" in proc.stdout
    records = {
        p.parent.name: json.loads(p.read_text())["status"] for p in sweep_dir.glob("*/job.json")
    }
    assert sorted(records.values()) == ["complete", "complete", "failed", "failed"]
