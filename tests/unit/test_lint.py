"""The house tooling (STYLE.md section 8) holds on the whole tree: ruff, and mypy on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing() -> None:
    proc = run_tool("ruff", "check", "cachepilot_sim", "tests", "experiments")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package() -> None:
    proc = run_tool("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
