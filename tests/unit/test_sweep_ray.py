"""Optional: the same sweep on a local Ray instance through Hydra's Ray launcher.

Needs the `ray-launcher` extra (`pip install -e '.[ray-launcher]'`); skipped, saying so, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray-launcher]'")
pytest.importorskip(
    "hydra_plugins.hydra_ray_launcher",
    reason="hydra-ray-launcher is an optional extra: pip install -e '.[ray-launcher]'",
)

from cachepilot_sim.tools.collect import collect  # noqa: E402


@pytest.mark.slow
def test_sweep_runs_on_a_local_ray_instance(tmp_path: Path, ray_tmpdir: Path) -> None:
    # RAY_TMPDIR: a short folder (Ray's socket paths must stay below 107 bytes).
    env = os.environ | {"RAY_TMPDIR": str(ray_tmpdir), "RAY_USAGE_STATS_ENABLED": "0"}
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "--multirun",
            "hydra/launcher=ray",
            "policy=perc,lru",
            "seed=0,1",
            "seeds=1",
            "workload.num_requests=20",
            "workload.max_active_sessions=4",
            "+hydra.launcher.ray.init.num_cpus=2",
            f"+hydra.launcher.ray.init._temp_dir={ray_tmpdir}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray Launcher is launching 4 jobs" in proc.stdout + proc.stderr
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("*/job.json")]
    assert len(records) == 4 and {r["status"] for r in records} == {"complete"}
    table = collect(sweep_dir)["table"]
    assert table.height == 4 and set(table["seed"]) == {0, 1}
    assert set(table["policy"]) == {"perc", "lru"}
