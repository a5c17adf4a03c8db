"""The house tooling (STYLE.md section 8) holds on the whole tree: ruff, and mypy on the package."""

from __future__ import annotations

import os
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
    """The whole package (pyproject's [tool.mypy]), incrementally: the cache lives outside the
    checkout (unless MYPY_CACHE_DIR says where), so that a fresh clone on the same machine
    reuses what an earlier run learned about unchanged modules (numpy, polars, torch ...) and
    checks only what changed; mypy validates every cached module against its source hash."""
    cache = os.environ.get("MYPY_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cachepilot-sim" / "mypy"
    )
    proc = run_tool("mypy", "--cache-dir", cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_leaves_the_tree_unchanged() -> None:
    proc = run_tool("ruff", "format", "--check", ".")  # code, notebooks and docs code blocks
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_component_class_and_public_method_has_a_docstring() -> None:
    """The components are the model: each says what it models (STYLE.md section 8)."""
    import ast

    missing = []
    for path in sorted((ROOT / "cachepilot_sim" / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            if ast.get_docstring(node) is None:
                missing.append(f"{path.name}:{node.name}")
            for item in node.body:
                public = isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
                if public and ast.get_docstring(item) is None:
                    missing.append(f"{path.name}:{node.name}.{item.name}")
    assert not missing, missing


def test_no_module_outside_kernels_is_over_400_lines() -> None:
    """STYLE.md section 8; kernels/ holds one launcher per measured variant on purpose."""
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in sorted((ROOT / "cachepilot_sim").rglob("*.py"))
        if "kernels" not in p.parts and (n := len(p.read_text().splitlines())) > 400
    ]
    assert not long, long
