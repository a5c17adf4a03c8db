"""Figures of a run, a sweep or a parent folder of runs: `cachepilot-sim plot <dir>`.

The runs under the folder are found (every `metrics.json`), their configs read
(`.hydra/config.yaml`, else `run_meta.json`) and the keys whose values differ become facets:
seeds of one configuration are pooled (n shown), different configurations never are. Written to
`<dir>/plots/`, each figure with the numbers it draws as `<name>.csv`:
`headline_by_config` (realized restore, TTFT p99 and goodput per policy and configuration, 95 %
t intervals), `<metric>_vs_<x>` (when a numeric key differs, or `--x`), and from the traces
`vram_by_tier` (`_p<i>of<n>` when paginated), `latency_cdfs`, `restore_by_class` and
`gap_estimates`. `--report` also writes the sweep report (experiment/sweep_report.py).
A request that would pool different configurations (`--facet` leaving a differing key out,
`--where` naming an unknown key) is refused in one line naming the keys, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import yaml

from cachepilot_sim.experiment.runset import (
    Run,
    RunSetError,
    cells_frame,
    differing_keys,
    find_runs,
)
from cachepilot_sim.trace.derive import TraceError

PROG = "cachepilot-sim plot"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dir", type=Path, help="a run folder, a sweep folder, a parent of runs")
    ap.add_argument("--out", type=Path, default=None, help="default: <dir>/plots")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    ap.add_argument(
        "--metric",
        action="append",
        default=None,
        help="metric of the <metric>_vs_<x> figure (repeatable; default realized_restore_s)",
    )
    ap.add_argument(
        "--x",
        "--param",
        dest="x",
        default=None,
        help="x axis of <metric>_vs_<x> (default: the first numeric differing key)",
    )
    ap.add_argument(
        "--facet",
        action="append",
        default=None,
        help="panel by this key (repeatable); default: every differing key but x. "
        "A differing key left out is refused, never pooled",
    )
    ap.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep only runs whose config has this value (repeatable)",
    )
    ap.add_argument("--per-page", type=int, default=6, help="VRAM rows per file")
    ap.add_argument("--no-traces", action="store_true", help="skip the trace figures")
    ap.add_argument("--report", action="store_true", help="also write the sweep report at dir")
    return ap.parse_args(argv)


def select(runs: list[Run], where: list[str]) -> list[Run]:
    """The runs whose config matches every `key=value` (values compared as YAML scalars)."""
    for item in where:
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise RunSetError(f"--where {item!r}: expected KEY=VALUE")
        if not any(key in r.config for r in runs):
            raise RunSetError(f"--where {item!r}: no run's config has the key {key!r}")
        want = yaml.safe_load(text)
        runs = [r for r in runs if r.config.get(key) == want or str(r.config.get(key)) == text]
    if where and not runs:
        raise RunSetError(f"--where {' '.join(where)}: no run left")
    return runs


def layout(keys: list[str], frame: Any, x: str | None, facet: list[str] | None) -> tuple:
    """(x, facets): x defaults to the first numeric differing key; every differing key must be
    x, a facet or the policy, else the request would pool configurations and is refused."""
    if x is not None and x not in keys:
        raise RunSetError(f"--x {x}: not a differing config key; differing: {keys or 'none'}")
    if x is None and facet is None:  # explicit facets: the user lays out; no x unless asked
        x = next((k for k in keys if frame[k].dtype.is_numeric()), None)
    facets = [k for k in keys if k != x] if facet is None else facet
    unknown = [k for k in facets if k not in keys]
    if unknown:
        raise RunSetError(
            f"--facet {', '.join(unknown)}: not a differing config key; "
            f"differing: {', '.join(keys) or 'none'}"
        )
    pooled = [k for k in keys if k != x and k not in facets]
    if pooled:
        raise RunSetError(
            f"refusing to pool different configurations: {', '.join(pooled)} differ; add them "
            "with --facet or keep one value with --where"
        )
    return x, facets


def draw(args: argparse.Namespace, out: Path) -> list[Path]:
    from cachepilot_sim.experiment.sweep_report import headline_data, headline_figure
    from cachepilot_sim.tools.figures import (
        gap_estimates,
        latency_cdfs,
        load_runs,
        restore_by_class,
        vram_pages,
    )
    from cachepilot_sim.tools.sweep_figures import metric_vs_param, save

    runs = select(find_runs(args.dir), args.where)
    if not runs:
        raise RunSetError(f"{args.dir}: no run folder (none holds metrics.json)")
    keys = differing_keys(runs)
    frame = cells_frame(runs, keys)
    x, facets = layout(keys, frame, args.x, args.facet)
    paths = [
        save(
            headline_figure(frame, data := headline_data(frame, keys)),
            data,
            out,
            "headline_by_config",
            args.format,
        )
    ]
    for metric in (args.metric or ["realized_restore_s"]) if x else []:
        if metric not in frame.columns:
            raise RunSetError(f"metric '{metric}' not in the runs' cells")
        paths.append(metric_vs_param(frame, metric, x, out, args.format, facets=facets))
    if args.no_traces or not any(r.dir.glob("trace/*/meta.json") for r in runs):
        return paths
    root = args.dir if not args.where else None
    traces, requests, gaps = load_runs(root, keys) if root else _selected_traces(runs, keys)
    pages = vram_pages(traces, args.per_page)
    for i, (fig, data) in enumerate(pages, 1):
        name = "vram_by_tier" if len(pages) == 1 else f"vram_by_tier_p{i}of{len(pages)}"
        paths.append(save(fig, data, out, name, args.format))
    for name, (fig, data) in (
        ("latency_cdfs", latency_cdfs(requests)),
        ("restore_by_class", restore_by_class(requests)),
        ("gap_estimates", gap_estimates(gaps)),
    ):
        paths.append(save(fig, data, out, name, args.format))
    return paths


def _selected_traces(runs: list[Run], keys: list[str]) -> tuple:
    """load_runs over the selected runs only (one call per run, then joined)."""
    import polars as pl

    from cachepilot_sim.experiment.runset import run_labels
    from cachepilot_sim.tools.figures import TraceRun, load_runs

    labels = run_labels(runs, keys)
    traces: list[TraceRun] = []
    requests, gaps = [], []
    for run in runs:
        t, r, g = load_runs(run.dir, [])
        config = labels[run.name]
        traces += [
            TraceRun(f"{config} · {x.policy} s{x.seed}", x.lf, config, x.policy, x.seed) for x in t
        ]
        requests.append(r.with_columns(pl.lit(config).alias("config")))
        gaps.append(g.with_columns(pl.lit(config).alias("config")))
    return traces, pl.concat(requests, how="diagonal_relaxed"), pl.concat(gaps)


def write_and_list(prog: str, folder: Path, write: Callable[[], list[Path]]) -> int:
    """The tail of `plot` and `report`: refuse a missing folder, run `write` and print the paths
    it wrote (exit 0), or say in one line what was wrong, naming the file (exit 2)."""
    matplotlib.use("Agg")  # files only: no display needed on servers and CI
    try:
        if not folder.is_dir():
            raise RunSetError(f"{folder}: no such folder")
        paths = write()
    except (RunSetError, TraceError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{prog}: {err.filename}: cannot write ({err.strerror})", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return write_and_list(PROG, args.dir, lambda: plot_and_report(args))


def plot_and_report(args: argparse.Namespace) -> list[Path]:
    """The figures of `args.dir`, then with `--report` the sweep report's first two files."""
    if args.report and (args.dir / "metrics.json").is_file():
        raise RunSetError(f"--report: {args.dir} is a run folder (the run wrote its report)")
    paths = draw(args, args.out or args.dir / "plots")
    if args.report:
        from cachepilot_sim.experiment.sweep_report import write_sweep_report

        paths += write_sweep_report(args.dir)[:2]
    return paths


if __name__ == "__main__":
    sys.exit(main())
