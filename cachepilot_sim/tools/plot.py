"""Figures of a run or a sweep: `python -m cachepilot_sim.tools.plot <run-or-sweep dir>`.

From every trace folder under the directory (`.../trace/<policy>_seed<k>/` with its meta.json):
VRAM by tier over time with evictions marked, TTFT and TPOT CDFs per policy, restore cost by
workload class, and the reuse estimator's predicted gaps (1/lambda) against the true gaps. For a
sweep folder also the collected metric-vs-parameter plot (cachepilot_sim.tools.collect). Written to
`<dir>/plots/`.
The notebooks in notebooks/ draw the same figures with the functions of `tools/figures.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

from cachepilot_sim.tools.collect import CollectError, collect
from cachepilot_sim.tools.figures import run_figures
from cachepilot_sim.trace.derive import TraceError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cachepilot_sim.tools.plot", description=__doc__)
    ap.add_argument("dir", type=Path, help="a run folder, a sweep folder or one trace folder")
    ap.add_argument("--out", type=Path, default=None, help="default: <dir>/plots")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    ap.add_argument("--metric", default="realized_restore_s", help="sweeps: metric to plot")
    ap.add_argument("--param", default=None, help="sweeps: x axis (default: first swept number)")
    args = ap.parse_args(argv)
    matplotlib.use("Agg")  # files only: no display needed on servers and CI
    out = args.out or args.dir / "plots"
    paths: list[Path] = []
    try:
        if any(args.dir.rglob(".hydra/overrides.yaml")) and any(args.dir.rglob("job.json")):
            try:
                result = collect(args.dir, out, args.metric, args.param, args.format)
                paths += [result["plot"]] if "plot" in result else []
            except CollectError as err:
                print(f"cachepilot_sim.tools.plot: {err}", file=sys.stderr)
                return 2
        paths += run_figures(args.dir, out, args.format)
    except TraceError as err:
        print(f"cachepilot_sim.tools.plot: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
