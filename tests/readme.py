"""The README's quick commands (issue 16) and the 5-minute tour's files, as tests read them."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.install import user_env

ROOT = Path(__file__).resolve().parents[1]
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


@dataclass
class Tour:
    """The quick commands as run in `work`, in README order, up to the first that failed."""

    work: Path
    runs: list[subprocess.CompletedProcess[str]]


def take_the_tour(bin_dir: Path, work: Path) -> Tour:
    """Run every quick command with bash in the empty folder `work`, `cachepilot-sim` being the
    one in bin_dir (PATH first) and nothing leading back to the checkout."""
    work.mkdir()
    env = user_env(PATH=f"{bin_dir}:{user_env()['PATH']}", MPLBACKEND="Agg")
    runs = []
    for command in quick_commands(README):
        runs.append(
            subprocess.run(
                ["bash", "-c", command],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )  # fmt: skip
        )
        if runs[-1].returncode != 0:
            break
    return Tour(work, runs)
