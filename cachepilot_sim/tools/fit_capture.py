"""Fit what a lazy CUDA-graph capture adds to its step, from a real engine's captures.

    python -m cachepilot_sim.tools.fit_capture GROUND_TRUTH_DIR [...]

Reads every run (steps.parquet beside engine.json) under the folders and prints
`engine.graph_capture_us` for an engine profile: per run, the median excess time of the steps that
captured a graph over the steps of the same padded shape that did not; the median over the runs
(validation/engine_behaviour.py). Fit on runs you will not validate the stall on. Bad input: one
line naming the file, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

from cachepilot_sim.inputs import InputError, one_line, read_json, refuse_special_file
from cachepilot_sim.validation.engine_behaviour import fit_capture_stall


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cachepilot_sim.tools.fit_capture")
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    runs: list[tuple[pl.DataFrame, int | None]] = []
    for folder in args.folders:
        files = sorted(folder.rglob("steps.parquet")) if folder.is_dir() else []
        if not files:
            _fail(f"{folder}: no steps.parquet under this folder")
        for path in files:
            try:
                engine = read_json(path.parent / "engine.json", "engine settings")
                refuse_special_file(path, "steps file")  # a FIFO blocked polars past SIGTERM
                steps = pl.read_parquet(path)
            except InputError as err:
                _fail(one_line(err))
            except (OSError, pl.exceptions.PolarsError) as err:
                _fail(f"{path.parent}: unreadable run ({err})")
            if not isinstance(engine, dict):
                _fail(f"{path.parent / 'engine.json'}: not a JSON object")
            pages = engine.get("num_pages")
            runs.append((steps, pages if isinstance(pages, int) else None))
    try:
        stall = fit_capture_stall(runs)
    except (ValueError, pl.exceptions.PolarsError) as err:
        _fail(f"{', '.join(map(str, args.folders))}: {err}")
    print(f"engine.graph_capture_us: {stall}")
    print(f"# median over {len(runs)} runs of the excess of capture steps over same-shape steps")


if __name__ == "__main__":
    main()
