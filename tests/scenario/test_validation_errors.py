"""CI guard of fidelity: validate a subset of the committed ground truth and fail when an error
grows past the committed table (experiments/validation/hf_cb/2026-12-01/errors.json, written by
`python -m cachepilot_sim.validate experiments/validation/hf_cb/2026-12-01 --json ...`) by more
than one percentage point."""

from __future__ import annotations

import json
from pathlib import Path

from cachepilot_sim.tools.validate import TABLE, validate_runs

ROOT = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01"
SUBSET = ["closed_b16", "poisson_r3", "multiturn", "pressure_soft_reset", "pressure_preempt"]
TOLERANCE = 0.01


def test_validation_errors_do_not_grow_past_the_committed_table() -> None:
    committed = json.loads((ROOT / "errors.json").read_text())["workloads"]
    now, _ = validate_runs(ROOT, "hf_cb", SUBSET)
    assert sorted(now) == sorted(SUBSET)
    worse = [
        (wl, key, committed[wl][key], now[wl][key])
        for wl in SUBSET
        for key in TABLE
        if abs(now[wl][key]) > abs(committed[wl][key]) + TOLERANCE
    ]
    assert not worse, worse
