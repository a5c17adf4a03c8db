"""The README's quick commands work as written (issue 16): every command in a fenced block whose
info string is `bash quick` runs, in README order, in an empty folder, through the
`cachepilot-sim` console script of a fresh install of the wheel (the `tour` fixture), and exits
0; every `outputs/tour/...` file that the 5-minute tour names then exists. The commands of every
other page (and that none writes into the committed folders) are checked in
tests/docs/test_doc_commands.py."""

from __future__ import annotations

import pytest

from tests.readme import README, Tour, quick_commands, tour_files, tour_section


def test_the_tour_has_quick_commands_and_names_its_files() -> None:
    commands = quick_commands(tour_section(README))
    assert len(commands) >= 5 and all(c.split()[0] in ("cachepilot-sim", "cat") for c in commands)
    assert {"cachepilot-sim plot"} <= {" ".join(c.split()[:2]) for c in commands}
    assert any("samples:" in c for c in commands)  # a shipped trace sample is replayed
    files = tour_files(README)
    assert any(f.endswith("report.html") for f in files) and any("plots/" in f for f in files)


@pytest.mark.slow
def test_every_quick_command_runs_in_an_empty_folder(tour: Tour) -> None:
    failed = [f"{r.args[-1]}\n{r.stderr[-2000:]}" for r in tour.runs if r.returncode != 0]
    assert failed == []
    assert [r.args[-1] for r in tour.runs] == quick_commands(README)
    missing = [f for f in tour_files(README) if not (tour.work / f).is_file()]
    assert missing == []
