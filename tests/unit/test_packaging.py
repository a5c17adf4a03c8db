"""A non-editable `pip install .` into a fresh venv runs the console command from any folder.

This is what a user outside the repository gets: the configs must come from the installed package
(package-data), not from a checkout. Slow (a fresh venv installs every dependency).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pip_install_runs_the_smoke_experiment_outside_the_checkout(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if install.returncode != 0 and "No matching distribution" in install.stderr:
        pytest.skip(f"no package index reachable: {install.stderr.strip()[-200:]}")
    assert install.returncode == 0, install.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = subprocess.run(
        [str(venv / "bin" / "cachepilot-sim"), "+experiment=smoke", "seeds=1",
         "hydra.run.dir=out", "telemetry.progress=false"],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads((work / "out" / "metrics.json").read_text())
    assert {c["policy"] for c in report["cells"]} == {"perc", "lru", "priority"}
    help_text = subprocess.run(
        [str(venv / "bin" / "cachepilot-sim"), "--help"], cwd=work, capture_output=True, text=True
    ).stdout
    assert "Config groups" in help_text and "policy: " in help_text
