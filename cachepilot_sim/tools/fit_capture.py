"""Fit a lazy CUDA-graph capture's stall from the captures a real engine logged.

    python -m cachepilot_sim.tools.fit_capture GROUND_TRUTH_DIR [...]

Reads every engine.json under the folders (`graph_captures_during_run`: key and duration of each
capture made while serving) and prints `engine.graph_capture_us` and
`engine.graph_capture_us_per_token` for an engine profile (validation/engine_behaviour.py). Fit
on runs you will not validate the stall on. Bad input: one line naming the file, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cachepilot_sim.validation.engine_behaviour import fit_capture_cost


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cachepilot_sim.tools.fit_capture")
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    runs = []
    for folder in args.folders:
        files = sorted(folder.rglob("engine.json")) if folder.is_dir() else []
        if not files:
            print(f"error: {folder}: no engine.json under this folder", file=sys.stderr)
            raise SystemExit(2)
        for path in files:
            try:
                runs.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError) as err:
                print(f"error: {path}: not JSON ({err})", file=sys.stderr)
                raise SystemExit(2) from None
    try:
        fixed, per_token, resid = fit_capture_cost(runs)
    except (ValueError, KeyError, TypeError, IndexError) as err:
        print(f"error: {', '.join(map(str, args.folders))}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"engine.graph_capture_us: {fixed}")
    print(f"engine.graph_capture_us_per_token: {per_token}")
    print(f"# mean |relative error| per capture: {resid:.1%} over {len(runs)} runs")


if __name__ == "__main__":
    main()
