"""A metric against a swept parameter, one panel per value of every other differing key.

Rows of the table are (job, policy, seed) cells. Before drawing, `check_no_pooling` makes sure
that no two rows share (facets, x, hue, seed): otherwise two configurations would be averaged as
if they were seeds, and the figure refuses, naming the keys. Line = mean over seeds, whisker = its
95 % t interval; the data drawn (mean, ci95, n per point) is returned with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl

from cachepilot_sim.experiment.runset import check_no_pooling, config_label, group_stats, wrapped
from cachepilot_sim.plotting import style

FACET = "facet"  # column of the data: the panel's label (`key=value, ...` of the facet keys)


def save(fig: plt.Figure, data: pl.DataFrame, out_dir: Path, name: str, fmt: str) -> Path:
    """`<name>.<fmt>` and the numbers it draws as `<name>.csv`, each to a temporary name first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.{fmt}"
    tmp = path.with_name(f"{name}.tmp.{fmt}")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    csv = out_dir / f"{name}.csv"
    data.write_csv(csv.with_name(f"{name}.tmp.csv"))
    csv.with_name(f"{name}.tmp.csv").replace(csv)
    return path


def metric_vs_param_data(
    frame: pl.DataFrame, metric: str, param: str, hue: str = "policy", facets: Sequence[str] = ()
) -> pl.DataFrame:
    """Per (facet, param value, hue): n (seeds pooled), mean and ci95 of `metric`."""
    facets = [f for f in facets if f not in (param, hue)]
    check_no_pooling(frame, [*facets, param, hue], [c for c in frame.columns if c != metric])
    labelled = frame.with_columns(
        pl.Series(
            FACET,
            [
                config_label(dict(zip(facets, r, strict=True)))
                for r in frame.select(facets).iter_rows()
            ]
            if facets
            else ["one configuration"] * frame.height,
        )
    )
    stats = group_stats(labelled, [FACET, *facets, param, hue], [metric])
    return stats.rename({f"{metric}_mean": "mean", f"{metric}_ci": "ci95"}).sort(FACET, param)


def fig_metric_vs_param(
    frame: pl.DataFrame, metric: str, param: str, hue: str = "policy", facets: Sequence[str] = ()
) -> plt.Figure:
    """metric_vs_param_figure without its data."""
    return metric_vs_param_figure(frame, metric, param, hue, facets)[0]


def metric_vs_param_figure(
    frame: pl.DataFrame, metric: str, param: str, hue: str = "policy", facets: Sequence[str] = ()
) -> tuple[plt.Figure, pl.DataFrame]:
    """Mean of `metric` against `param`, one line per `hue`, one panel per facet combination."""
    hue_col = hue if hue in frame.columns else None
    if hue_col is None:
        frame = frame.with_columns(pl.lit(metric).alias("_hue"))
        hue = "_hue"
    data = metric_vs_param_data(frame, metric, param, hue, facets)
    panels = list(dict.fromkeys(data[FACET].to_list()))
    hues = list(dict.fromkeys(data[hue].to_list()))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(1 + 5.5 * len(panels), 4.3), squeeze=False, sharey=True
    )
    for ax, panel in zip(axes[0], panels, strict=True):
        part = data.filter(pl.col(FACET) == panel)
        for i, value in enumerate(hues):
            d = part.filter(pl.col(hue) == value).sort(param)
            if d.height == 0:
                continue
            n = "/".join(map(str, sorted(set(d["n"].to_list()))))
            ax.errorbar(
                d[param],
                d["mean"],
                yerr=d["ci95"],
                capsize=3,
                lw=1.3,
                ms=5,
                label=f"{value} (n={n} seeds)",
                **style(i, str(value)),
            )  # type: ignore[arg-type]
        ax.set_xlabel(param)
        ax.set_ylabel(metric)
        ax.set_title(
            f"{wrapped(panel)}\nline: mean over seeds, whisker: 95 % t interval", fontsize=8
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, data.drop("_hue", strict=False)


def metric_vs_param(
    frame: pl.DataFrame,
    metric: str,
    param: str,
    out_dir: Path,
    fmt: str = "png",
    hue: str = "policy",
    facets: Sequence[str] = (),
) -> Path:
    """Save metric_vs_param_figure as `<metric>_vs_<param>.<fmt>` with its `.csv`."""
    fig, data = metric_vs_param_figure(frame, metric, param, hue, facets)
    return save(fig, data, out_dir, f"{metric}_vs_{param}", fmt)
