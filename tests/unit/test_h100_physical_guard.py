"""CI guard of the held-out H100 cells: engine=hf_cb_physical replayed on the engine's defaults
gives, cell by cell, the committed errors_hf_cb_physical_defaults.json (the README's H100 row and
the trust label come from it), and stays within the targets it is reported to meet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.tools.validate import validate_runs

H100 = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-06-h100"


def test_the_committed_h100_defaults_cells_hold() -> None:
    committed = json.loads((H100 / "errors_hf_cb_physical_defaults.json").read_text())["workloads"]
    fresh, _ = validate_runs(H100 / "defaults", "hf_cb_physical")
    assert set(fresh) == set(committed)
    for workload, cells in committed.items():
        for key, value in cells.items():
            if key.endswith("_err") and value is not None:
                assert fresh[workload][key] == pytest.approx(value, abs=5e-3), (workload, key)
    below = [w for w in committed if not w.startswith("pressure")]
    for w in below:  # TPOT and E2E means within 5 % off the fitted configuration
        assert abs(fresh[w]["tpot_mean_err"]) < 0.05 and abs(fresh[w]["e2e_mean_err"]) < 0.05, w
