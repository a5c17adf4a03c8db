"""The README's quick commands work as written (issue 16): every command in a fenced block whose
info string is `bash quick` runs, in README order, in an empty folder, through an executable
`cachepilot-sim` on the PATH (as pip's console script), and exits 0; every `outputs/tour/...`
file that the 5-minute tour names then exists. The README also keeps its runs out of the
committed folders: no command writes into `experiments/` or `docs/` unless marked as a maintainer
command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
QUICK_BLOCK = re.compile(r"^```bash quick\n(.*?)^```", re.S | re.M)


def quick_commands(text: str) -> list[str]:
    """The commands of every `bash quick` block, in order; `\\` continuations joined."""
    commands: list[str] = []
    for block in QUICK_BLOCK.findall(text):
        joined = block.replace("\\\n", " ")
        commands += [ln.strip() for ln in joined.splitlines() if ln.strip() and ln[0] != "#"]
    return commands


def tour_section(text: str) -> str:
    start = text.index("## 5-minute tour")
    return text[start : text.index("\n## ", start + 1)]


def tour_files(text: str) -> list[str]:
    """Files the tour says a run writes: backticked `outputs/tour/...` paths with a suffix."""
    paths = re.findall(r"`(outputs/tour/[^`\s<>]+\.[a-z]+)`", tour_section(text))
    return sorted(set(paths))


def test_the_tour_has_quick_commands_and_names_its_files() -> None:
    commands = quick_commands(tour_section(README))
    assert len(commands) >= 5 and all(c.split()[0] in ("cachepilot-sim", "cat") for c in commands)
    assert {"cachepilot-sim plot"} <= {" ".join(c.split()[:2]) for c in commands}
    assert any("samples:" in c for c in commands)  # a shipped trace sample is replayed
    files = tour_files(README)
    assert any(f.endswith("report.html") for f in files) and any("plots/" in f for f in files)


# A command that writes into the committed folders: an output option or a run folder there.
WRITES_COMMITTED = re.compile(
    r"(--out|--json|--plot|hydra\.(run|sweep)\.dir=)[= ]*(experiments|docs)/"
)


def test_no_readme_command_writes_into_committed_folders() -> None:
    """A command that regenerates committed files is written in a block or line that says
    `maintainer` (so a reader does not overwrite them by following the README)."""
    offending = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", README, re.S | re.M):
        if "maintainer" not in block and WRITES_COMMITTED.search(block):
            offending.append(block.strip().splitlines()[0])
    for line in README.splitlines():
        if line.startswith("`") or "`" in line:
            for code in re.findall(r"`([^`]+)`", line):
                if WRITES_COMMITTED.search(code) and "maintainer" not in line:
                    offending.append(code)
    assert offending == []


@pytest.mark.slow
def test_every_quick_command_runs_in_an_empty_folder(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "cachepilot-sim"
    exe.write_text(
        "#!/bin/sh\n"
        f'exec {sys.executable} -c \'import sys; sys.argv[0] = "{exe}"; '
        'from cachepilot_sim.tools.cli import main; main()\' "$@"\n'
    )
    exe.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "MPLBACKEND": "Agg",
    }
    env.pop("CACHEPILOT_TRACES_DIR", None)  # the tour needs only what the package ships
    for command in quick_commands(README):
        proc = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    missing = [f for f in tour_files(README) if not (work / f).is_file()]
    assert missing == []
