"""The README's quick commands work as written (issue 16): every command in a fenced block whose
info string is `bash quick` runs, in README order, in an empty folder, through the
`cachepilot-sim` console script of a fresh install of the wheel (the `tour` fixture), and exits
0; every `outputs/tour/...` file that the 5-minute tour names then exists. The README also keeps
its runs out of the committed folders: no command writes into `experiments/` or `docs/` unless
marked as a maintainer command."""

from __future__ import annotations

import re

import pytest

from tests.readme import README, Tour, quick_commands, tour_files, tour_section


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
def test_every_quick_command_runs_in_an_empty_folder(tour: Tour) -> None:
    failed = [f"{r.args[-1]}\n{r.stderr[-2000:]}" for r in tour.runs if r.returncode != 0]
    assert failed == []
    assert [r.args[-1] for r in tour.runs] == quick_commands(README)
    missing = [f for f in tour_files(README) if not (tour.work / f).is_file()]
    assert missing == []
