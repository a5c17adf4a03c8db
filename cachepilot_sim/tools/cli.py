"""The console command `cachepilot-sim`: an experiment run, or a tool named by its first word.

`cachepilot-sim [overrides]` is exactly `python -m cachepilot_sim [overrides]` (Hydra parses the
command line, so `key=value`, `+experiment=...`, `--multirun`, `--help` and `-sc` work as there).
`cachepilot-sim TOOL [args]` runs a tool's `main(args)`. A Hydra override always holds `=` or
starts with `-` or `~`, so a bare first word that names a tool can never be mistaken for one, and a
bare word that names none is a mistyped tool: "no tool X; did you mean Y", exit 2 (not Hydra's
grammar error). `--help` alone prints the app help without starting Hydra or importing the
simulator (conf.app_help), so it answers in a fraction of a second.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence

# Tool name on the command line -> module under cachepilot_sim.tools (imported only when run).
TOOLS: dict[str, str] = {
    "plot": "plot",
    "report": "report",
    "collect": "collect",
    "scorecard": "scorecard",
    "profile-dataset": "profile_dataset",
    "calibrate": "calibrate",
    "train-admission": "train_admission",
    "train-forecast": "train_forecast",
    "validate": "validate",
    "fit-engine": "fit_engine",
    "fit-capture": "fit_capture",
    "profile-gpu": "profile_gpu",
    "trust-table": "trust_table",
    "trace-export": "trace_export",
    "plan": "plan",
}


def available_tools() -> dict[str, str]:
    """The tools of TOOLS whose module this installation has."""
    return {
        name: module
        for name, module in TOOLS.items()
        if importlib.util.find_spec(f"cachepilot_sim.tools.{module}") is not None
    }


def run_tool(name: str, argv: Sequence[str]) -> int:
    """Run one tool's main(argv) under the console command's name; returns its exit status. Every
    tool ends as entry.entry_point says: a bad input is one line and status 2, a stop signal one
    line and 128 + the signal, never a traceback (CACHEPILOT_TRACEBACK=1 shows one)."""
    from cachepilot_sim.entry import entry_point

    module = importlib.import_module(f"cachepilot_sim.tools.{available_tools()[name]}")
    sys.argv = [f"cachepilot-sim {name}", *argv]  # argparse's usage line names the command
    status = entry_point(f"cachepilot-sim {name}")(module.main)(list(argv))
    return int(status or 0)


# A bare word: what a tool name looks like and no Hydra override can be (no `=`, `-`, `+`, `~`).
BARE_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def unknown_tool(word: str) -> str:
    """The one-line error for a bare first word that names no tool, with the closest names."""
    tools = sorted(available_tools())
    close = difflib.get_close_matches(word, tools, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"cachepilot-sim: no tool {word!r}{hint} (tools: {', '.join(tools)}; an experiment "
        "override is key=value, e.g. +experiment=smoke)"
    )


def main() -> None:
    """Console entry point (`[project.scripts] cachepilot-sim`)."""
    args = sys.argv[1:]
    if args and args[0] in available_tools():
        sys.exit(run_tool(args[0], args[1:]))
    if args and BARE_WORD.match(args[0]):
        print(unknown_tool(args[0]), file=sys.stderr)
        sys.exit(2)
    if args in (["--help"], ["-h"]):  # the app help alone: no Hydra start-up, no simulator
        from cachepilot_sim.conf import app_help

        print(app_help())
        return
    from cachepilot_sim.__main__ import main as run_experiment_app

    run_experiment_app()


if __name__ == "__main__":
    main()
