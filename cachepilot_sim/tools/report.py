"""The one-page report of a sweep or a parent folder of runs: `cachepilot-sim report <folder>`.

Writes report.md, a self-contained report.html, results.csv (one row per job x policy x seed),
headline_by_config.png/.csv and sweep_meta.json at the folder (experiment/sweep_report.py). A
`--multirun` writes it by itself when the sweep ends; a single run writes its own report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "cachepilot-sim report"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__)
    ap.add_argument("dir", type=Path, help="a sweep folder, or any folder of run folders")
    args = ap.parse_args(argv)
    from cachepilot_sim.experiment.sweep_report import write_sweep_report
    from cachepilot_sim.tools.plot import write_and_list

    return write_and_list(PROG, args.dir, lambda: write_sweep_report(args.dir))


if __name__ == "__main__":
    sys.exit(main())
