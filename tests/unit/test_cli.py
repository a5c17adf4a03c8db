"""The console command: `--help`, tool dispatch and bash completion, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot_sim.conf import NOT_RUN_GROUPS, run_groups
from cachepilot_sim.tools.cli import TOOLS, available_tools

ROOT = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path) -> Path:
    """An executable `cachepilot-sim` in tmp_path, as pip's console-script wrapper makes one."""
    exe = tmp_path / "cachepilot-sim"
    exe.write_text(
        "#!/bin/sh\n"
        f'exec {sys.executable} -c \'import sys; sys.argv[0] = "{exe}"; '
        'from cachepilot_sim.tools.cli import main; main()\' "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip


def test_help_lists_the_groups_a_run_can_pick_and_every_tool(tmp_path: Path) -> None:
    out = run(str(cli(tmp_path)), "--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "is powered by Hydra" not in text and "_schema" not in text
    for group, options in run_groups().items():
        name = "+experiment" if group == "experiment" else group
        assert f"  {name}: {options[0]}" in text
    for group in NOT_RUN_GROUPS:
        assert f"  {group}:" not in text
    for tool in TOOLS:
        assert f"  {tool} " in text
    assert "cachepilot-sim +experiment=smoke" in text and "docs/observability.md" in text


def test_python_dash_m_shows_the_same_help() -> None:
    out = run(sys.executable, "-m", "cachepilot_sim", "--help")
    assert out.returncode == 0 and "Config groups" in out.stdout and "_schema" not in out.stdout


@pytest.mark.parametrize("tool", sorted(available_tools()))
def test_a_tool_name_dispatches_to_the_tool(tool: str, tmp_path: Path) -> None:
    out = run(str(cli(tmp_path)), tool, "--help")
    assert out.returncode == 0, out.stderr
    assert f"usage: cachepilot-sim {tool}" in out.stdout or "usage:" in out.stdout


def test_bash_completion_completes_groups_and_options(tmp_path: Path) -> None:
    exe = cli(tmp_path)
    script = (
        'eval "$(cachepilot-sim -sc install=bash)"\n'
        'COMP_LINE="cachepilot-sim policy=l"; COMP_POINT=${#COMP_LINE}; COMP_CWORD=1\n'
        "hydra_bash_completion; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
        'COMP_LINE="cachepilot-sim wor"; COMP_POINT=${#COMP_LINE}; COMP_CWORD=1\n'
        "hydra_bash_completion; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
        "complete -p cachepilot-sim\n"
    )
    out = run("bash", "-c", script, env={"PATH": f"{exe.parent}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert {"policy=lru", "policy=lfu"} <= set(lines)
    assert "workload=" in lines
    assert "hydra_bash_completion cachepilot-sim" in out.stdout


def test_help_alone_is_hydras_help_without_starting_hydra(tmp_path: Path) -> None:
    fast = run(str(cli(tmp_path)), "--help")
    hydra_help = run(sys.executable, "-m", "cachepilot_sim", "--help", "seed=0")  # through Hydra
    assert fast.returncode == 0 and fast.stdout == hydra_help.stdout
    probe = (
        "import sys; sys.argv = ['cachepilot-sim', '--help']\n"
        "from cachepilot_sim.tools.cli import main; main()\n"
        "heavy = [m for m in ('hydra', 'scipy', 'cachepilot_sim.experiment.runner', "
        "'cachepilot_sim.sim') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = run(sys.executable, "-c", probe)
    assert out.returncode == 0 and "HEAVY []" in out.stdout, out.stdout[-300:]


def test_a_config_error_does_not_import_the_runner() -> None:
    probe = (
        "import sys, atexit\n"
        "atexit.register(lambda: print('RUNNER', 'cachepilot_sim.experiment.runner' in "
        "sys.modules))\n"
        "sys.argv = ['cachepilot-sim', 'vram_gb=-1']\n"
        "from cachepilot_sim.tools.cli import main; main()\n"
    )
    out = run(sys.executable, "-c", probe)
    assert out.returncode == 2 and "vram_gb" in out.stderr and "RUNNER False" in out.stdout


@pytest.mark.parametrize(("word", "hint"), [("plann", "'plan'"), ("scorecrd", "'scorecard'")])
def test_a_mistyped_tool_name_says_which_tool_was_meant(
    tmp_path: Path, word: str, hint: str
) -> None:
    out = run(str(cli(tmp_path)), word, "--out", "x")
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.strip().splitlines()
    assert f"no tool '{word}'; did you mean {hint}?" in line


def test_a_word_like_no_tool_lists_the_tools(tmp_path: Path) -> None:
    out = run(str(cli(tmp_path)), "xyzzy")
    assert out.returncode == 2 and "did you mean" not in out.stderr
    assert "no tool 'xyzzy'" in out.stderr and "plan" in out.stderr
