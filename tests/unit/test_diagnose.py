"""experiments/validation/diagnose.py's subcommands run on the committed captures (the README quotes
their output)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from experiments.validation import diagnose

ROOT = Path(__file__).resolve().parents[2]
BURST = ROOT / "experiments" / "validation" / "hf_cb" / "2026-12-01" / "burst_4x" / "run1"


def test_itl_tail_compares_the_gap_tail_and_the_prefill_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert diagnose.main(["itl-tail", str(BURST), "--above", "40", "80", "--at", "1917"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"gaps > 40 ms: engine \d+, simulator \d+", out)
    assert re.search(r"prefill steps: engine \d+, simulator \d+", out)
    assert "engine step at" in out and "simulator step at" in out


def test_itl_tail_on_a_missing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert diagnose.main(["itl-tail", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
