"""A registry imports its provider at its first lookup (config/registry.py): importing the package
or a config module loads no policy, controller or router, and the first lookup sees all of them
(in a fresh interpreter, so nothing imported by other tests hides the order)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import cachepilot_sim
from cachepilot_sim.config.admission import known_controllers
from cachepilot_sim.config.cluster import known_routers
from cachepilot_sim.config.policy import known_policies
providers = ["cachepilot_sim.policies", "cachepilot_sim.admission", "cachepilot_sim.cluster"]
before = [p for p in providers if p in sys.modules]
names = {"policy": known_policies(), "admission": known_controllers(), "router": known_routers()}
after = [p for p in providers if p in sys.modules]
print(json.dumps({"before": before, "after": after, "names": names}))
"""


def test_the_first_lookup_loads_every_registered_choice_and_not_before() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    assert got["before"] == []
    assert sorted(got["after"]) == sorted(
        ["cachepilot_sim.policies", "cachepilot_sim.admission", "cachepilot_sim.cluster"]
    )
    assert {"perc", "lru", "oracle", "reuse_forecast"} <= set(got["names"]["policy"])
    assert {"all", "threshold", "learned"} <= set(got["names"]["admission"])
    assert {"round_robin", "prefix_aware", "session_affinity"} <= set(got["names"]["router"])
