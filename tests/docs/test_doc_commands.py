"""Every command that the README and the docs pages show is checked against the code (issue 32):
a `cachepilot-sim` run's overrides compose into a valid config (each value of a sweep), a tool or
script exists and knows every option the page passes it, a module exists, a make target exists;
a command the page shows being refused is refused. The 5-minute tour's commands also run
(tests/scenario/test_readme_commands.py); the rest are too long for a test and are composed, not
run. No page's command writes into the committed folders unless marked as a maintainer command."""

from __future__ import annotations

import importlib.util
import itertools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.lifecycle import refuse_ignored_overrides
from cachepilot_sim.tools.cli import TOOLS
from tests.docs.pages import ROOT, Command, commands, pages

register_configs()
MAKEFILE = (ROOT / "Makefile").read_text()
# A command written as a template for the reader to fill in, not as a command to run.
TEMPLATE = re.compile(r"<[^>]*>|\[overrides\]|\.\.\.|\bTOOL\b|\bPATH\b|\bRESULT\b|NAME\b")
# Words of a run that Hydra itself handles, not the config: flags and the hydra.* / hydra/* keys.
HYDRA_ONLY = re.compile(r"^(-|hydra[./]|install=)")
# A run that picks a config group written by an earlier command (profile-dataset's workload).
NEEDS_EARLIER_OUTPUT = "hydra.searchpath="

ALL = [c for p in pages() for c in commands(p)]


def _ids(cs: list[Command]) -> list[str]:
    return [c.where()[:90] for c in cs]


def is_run(c: Command) -> bool:
    if c.argv[0] == "cachepilot-sim":
        return len(c.argv) == 1 or c.argv[1] not in TOOLS
    return c.argv[:3] == ("python", "-m", "cachepilot_sim") or c.argv[:3] == (
        "python3", "-m", "cachepilot_sim",
    )  # fmt: skip


RUNS = [
    c
    for c in ALL
    if is_run(c) and not TEMPLATE.search(c.text) and NEEDS_EARLIER_OUTPUT not in c.text
]


def overrides(c: Command) -> list[list[str]]:
    """The override lists the command runs: one per job of a sweep (comma lists expanded)."""
    words = c.argv[1:] if c.argv[0] == "cachepilot-sim" else c.argv[3:]
    kept = [w for w in words if not HYDRA_ONLY.match(w)]
    multirun = "--multirun" in words or "-m" in words
    choices = []
    for w in kept:
        key, _, value = w.partition("=")
        if multirun and "," in value and not value.startswith("["):
            choices.append([f"{key}={v}" for v in value.split(",")])
        else:
            choices.append([w])
    return [list(job) for job in itertools.product(*choices)]


def compose_run(ovr: list[str]) -> None:
    """What a run checks before it starts: composition, ignored choices, the typed config."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=ovr)
    refuse_ignored_overrides(cfg, ovr)
    to_config(cfg)


def test_the_pages_show_commands_of_every_kind() -> None:
    heads = {" ".join(c.argv[:2]) for c in ALL}
    assert {"cachepilot-sim plot", "make run", "make test"} <= heads
    assert len(RUNS) >= 20 and any(c.refused for c in ALL)
    assert any(len(overrides(c)) > 1 for c in RUNS)  # a sweep is expanded into its jobs


@pytest.mark.parametrize("command", RUNS, ids=_ids(RUNS))
def test_every_documented_run_composes_into_a_valid_config(command: Command) -> None:
    for ovr in overrides(command):
        if command.refused:
            with pytest.raises(ValueError):
                compose_run(ovr)
        else:
            compose_run(ovr)


def source_of(c: Command) -> tuple[str, Path] | None:
    """What runs the non-run command, and its source file (None: a make target)."""
    a = c.argv
    if a[0] == "cachepilot-sim":
        return f"tool {a[1]}", ROOT / "cachepilot_sim" / "tools" / f"{TOOLS[a[1]]}.py"
    if a[0] in ("python", "python3") and len(a) > 2 and a[1] == "-m":
        if not a[2].startswith("cachepilot_sim"):
            return None  # another project's tool (SGLang's benchmark): its own docs hold it
        spec = importlib.util.find_spec(a[2])
        assert spec is not None and spec.origin, f"{c.where()}: no module {a[2]}"
        return f"module {a[2]}", Path(spec.origin)
    if a[0] in ("python", "python3"):
        return f"script {a[1]}", ROOT / a[1]
    return None


def names_a_placeholder(c: Command) -> bool:
    """A template whose tool, script or module itself is left for the reader (`<tool>`)."""
    a = c.argv
    what = a[2] if len(a) > 2 and a[1] == "-m" else (a[1] if len(a) > 1 else "")
    return bool(TEMPLATE.search(what)) or what.startswith("[")


ENTRY_IMPORT = re.compile(
    r"^from (cachepilot_sim[\w.]*) import|^import (cachepilot_sim[\w.]*)", re.M
)


def with_entry_modules(source: str) -> str:
    """A file's source and that of the package modules it imports (a `python -m` entry that hands
    over to a tool's main has its options there)."""
    for a, b in ENTRY_IMPORT.findall(source):
        spec = importlib.util.find_spec(a or b)
        if spec is not None and spec.origin:
            source += Path(spec.origin).read_text()
    return source


# Templates are checked too, up to their placeholders: the tool and the options exist.
OTHERS = [c for c in ALL if not is_run(c) and not names_a_placeholder(c)]


@pytest.mark.parametrize("command", OTHERS, ids=_ids(OTHERS))
def test_every_documented_tool_script_and_target_exists_with_its_options(command: Command) -> None:
    if command.argv[0] == "make":
        for target in command.argv[1:]:
            if "=" in target:  # a variable (EXPERIMENT=...): one the Makefile reads
                name = target.split("=", 1)[0]
                assert re.search(rf"^{re.escape(name)} \??=", MAKEFILE, re.M), command.where()
                continue
            assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.M), command.where()
        return
    found = source_of(command)
    if found is None:
        return
    what, path = found
    assert path.is_file(), f"{command.where()}: {what} is not at {path.relative_to(ROOT)}"
    source = with_entry_modules(path.read_text())
    for flag in {w.split("=")[0] for w in command.argv if w.startswith("--")}:
        assert f'"{flag}"' in source or f"'{flag}'" in source, (
            f"{command.where()}: {what} has no option {flag}"
        )


# A command that writes into the committed folders: an output option or a run folder there.
WRITES_COMMITTED = re.compile(
    r"(--out|--json|--plot|hydra\.(run|sweep)\.dir=)[= ]*(experiments|docs)/"
)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_no_page_command_writes_into_committed_folders(page: Path) -> None:
    """A command that regenerates committed files is written in a block or line that says
    `maintainer` (so a reader does not overwrite them by following the docs)."""
    text = page.read_text()
    offending = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        if "maintainer" not in block and WRITES_COMMITTED.search(block):
            offending.append(block.strip().splitlines()[0])
    for line in text.splitlines():
        for code in re.findall(r"`([^`]+)`", line):
            if WRITES_COMMITTED.search(code) and "maintainer" not in line:
                offending.append(code)
    assert offending == []
