"""A non-editable install of the wheel runs the console command from any folder.

This is what a user outside the repository gets (the `installed_bin` fixture, tests/install.py:
a fresh venv with the wheel and only its declared dependencies): the package imports from the
venv, the configs come from the installed package (package-data), not from a checkout, and the
README's tour (the `tour` fixture, shared with tests/scenario/test_readme_commands.py) runs the
smoke experiment with it in an empty folder.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.install import user_env
from tests.readme import Tour

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_installed_package_is_the_one_that_runs(installed_bin: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(installed_bin / "python"), "-c", "import cachepilot_sim as p; print(p.__file__)"],
        cwd=tmp_path, env=user_env(), capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(installed_bin.parent) and not Path(where).is_relative_to(ROOT)
    help_text = subprocess.run(
        [str(installed_bin / "cachepilot-sim"), "--help"],
        cwd=tmp_path, env=user_env(), capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "Config groups" in help_text and "policy: " in help_text


@pytest.mark.slow
def test_the_installed_command_runs_the_smoke_experiment_outside_the_checkout(tour: Tour) -> None:
    (smoke,) = [r for r in tour.runs if "+experiment=smoke hydra.run.dir=" in r.args[-1]]
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    assert not tour.work.is_relative_to(ROOT)
    report = json.loads((tour.work / "outputs/tour/smoke/metrics.json").read_text())
    assert {c["policy"] for c in report["cells"]} == {"perc", "lru", "priority"}
