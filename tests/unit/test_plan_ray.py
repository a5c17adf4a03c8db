"""Optional: the capacity planner on a local Ray instance (joblib's Ray backend) gives the same
plan.json as on joblib's local workers. Needs `ray` (`pip install -e '.[plan-ray]'`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[plan-ray]'")

from cachepilot_sim.tools import plan as plan_tool  # noqa: E402
from tests.unit.test_plan import write_plan  # noqa: E402


@pytest.mark.slow
def test_the_plan_on_a_local_ray_instance_matches_joblib(
    tmp_path: Path, ray_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmpdir))  # short: Ray's socket paths
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])
    )
    path = write_plan(tmp_path)
    assert plan_tool.main(["--config", str(path), "--out", str(tmp_path / "j")]) == 0
    assert (
        plan_tool.main(["--config", str(path), "--out", str(tmp_path / "r"), "launcher=RAY"]) == 0
    )
    assert (tmp_path / "r" / "plan.json").read_bytes() == (
        tmp_path / "j" / "plan.json"
    ).read_bytes()
