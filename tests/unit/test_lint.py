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
