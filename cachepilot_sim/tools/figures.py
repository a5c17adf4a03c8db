"""Figures of a run or a sweep with seaborn, from the event traces (one function per figure).

From every trace folder under a directory (`.../trace/<policy>_seed<k>/` with its meta.json):
VRAM by tier over time with evictions marked, TTFT and TPOT CDFs per policy, restore cost by
workload class, and the reuse estimator's predicted gaps (1/lambda) against the true gaps; for a
sweep, a metric against a swept parameter. `python -m cachepilot_sim.tools.plot` and
`cachepilot_sim.tools.collect` save them; the notebooks in notebooks/ draw them inline.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl
import seaborn as sns

from cachepilot_sim.trace.derive import TraceError, load_trace, request_results
from cachepilot_sim.trace.recorder import META_FILE

K = pl.col("kind")


def find_traces(root: Path) -> list[Path]:
    """Complete trace folders under `root` (each holds meta.json, written last by a run)."""
    root = Path(root)
    if (root / META_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.rglob(META_FILE) if p.parent.parent.name == "trace")


MAX_TIMELINES = 12  # VRAM panels drawn at most (the first traces in path order)


def _label(meta: dict, trace_dir: Path, root: Path) -> str:
    """`policy s<seed>`, prefixed with the job folder when the trace is inside a sweep job."""
    run = f"{meta.get('policy', trace_dir.name)} s{meta.get('seed', '?')}"
    job = trace_dir.parent.parent
    if job == root or root not in job.parents:  # a run folder, or one trace folder given
        return run
    return f"{job.relative_to(root)}: {run}"


def tier_timeline(trace: pl.LazyFrame) -> pl.DataFrame:
    """GB per tier over time: gpu = KV pool bytes used + in flight (iteration rows), cpu = CPU
    store bytes, flight = bytes being copied either way (running sums over copy events)."""
    b = pl.col("bytes")
    delta = (
        trace.filter(
            K.is_in(["evict_offload", "offload_done", "reload_start", "reload_done", "evict_drop"])
        )
        .sort("seq")
        .select(
            "t_us",
            pl.when(K == "evict_offload")
            .then(b)
            .when(K == "reload_done")
            .then(-b)
            .when((K == "evict_drop") & (pl.col("tier") == "cpu"))
            .then(-b)
            .otherwise(0)
            .cum_sum()
            .alias("cpu"),
            pl.when(K.is_in(["evict_offload", "reload_start"]))
            .then(b)
            .when(K.is_in(["offload_done", "reload_done"]))
            .then(-b)
            .otherwise(0)
            .cum_sum()
            .alias("flight"),
        )
    )
    gpu = trace.filter(K == "iteration").select("t_us", b.alias("gpu"))
    long = pl.concat(
        [
            gpu.unpivot(index="t_us", variable_name="tier", value_name="bytes"),
            delta.unpivot(index="t_us", variable_name="tier", value_name="bytes"),
        ]
    ).collect()
    return long.with_columns(
        (pl.col("t_us") / 1e6).alias("time_s"), (pl.col("bytes") / 1e9).alias("GB")
    )


def _save(fig: plt.Figure, out_dir: Path, name: str, fmt: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.{fmt}"
    tmp = path.with_name(f"{name}.tmp.{fmt}")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def plot_vram(traces: list[tuple[str, pl.LazyFrame]]) -> plt.Figure:
    """One panel per trace: GB by tier over time; GPU evictions as ticks along the bottom."""
    traces = traces[:MAX_TIMELINES]
    fig, axes = plt.subplots(
        len(traces), 1, figsize=(9, 2.6 * len(traces)), squeeze=False, sharex=True
    )
    for ax, (label, lf) in zip(axes[:, 0], traces, strict=True):
        line = tier_timeline(lf)
        # estimator=None: raw steps; seaborn's default would bootstrap a CI at every time point.
        sns.lineplot(
            data=line.to_pandas(),
            x="time_s",
            y="GB",
            hue="tier",
            ax=ax,
            drawstyle="steps-post",
            hue_order=["gpu", "cpu", "flight"],
            estimator=None,
            errorbar=None,
            sort=False,
        )
        # GPU evictions only (a cpu-tier evict_drop is the CPU store making room), as in the metrics
        gpu = (K == "evict_offload") | ((K == "evict_drop") & (pl.col("tier") != "cpu"))
        ev = lf.filter(gpu).select("t_us", "kind").collect()
        ax.plot(
            ev["t_us"].to_numpy() / 1e6,
            [0.0] * ev.height,
            "|",
            color="crimson",
            ms=10,
            label=f"evictions ({ev.height})",
        )
        ax.set_title(label, fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
    return fig


def plot_latency_cdfs(requests: pl.DataFrame) -> plt.Figure:
    done = requests.filter(pl.col("outcome") == "completed").with_columns(
        (pl.col("ttft_us") / 1e6).alias("TTFT s"), (pl.col("tpot_us") / 1e3).alias("TPOT ms")
    )
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    sns.ecdfplot(data=done.to_pandas(), x="TTFT s", hue="policy", ax=a, log_scale=True)
    sns.ecdfplot(
        data=done.filter(pl.col("generated") > 1).to_pandas(), x="TPOT ms", hue="policy", ax=b
    )
    a.set_title("TTFT CDF")
    b.set_title("TPOT CDF")
    return fig


def plot_restore_by_class(requests: pl.DataFrame) -> plt.Figure:
    """Realized restore seconds (reload + recompute) per workload class, mean over seeds."""
    per = requests.group_by("policy", "seed", "workload_class").agg(
        ((pl.col("reload_us") + pl.col("recompute_us")).sum() / 1e6).alias("restore s")
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.barplot(
        data=per.sort("workload_class", "policy").to_pandas(),
        x="workload_class",
        y="restore s",
        hue="policy",
        errorbar="sd",
        ax=ax,
    )
    ax.set_title("realized restore cost by workload class (bars: mean over seeds, whiskers: sd)")
    return fig


def plot_gap_estimates(gaps: pl.DataFrame) -> plt.Figure:
    """Predicted gap (1/lambda of the reuse estimator) against the true gap, log-log."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    if gaps.height:
        sns.scatterplot(
            data=gaps.to_pandas(),
            x="true gap s",
            y="predicted gap s",
            hue="policy",
            s=12,
            alpha=0.6,
            ax=ax,
        )
        both = gaps.select(pl.concat_list("true gap s", "predicted gap s").explode())
        lo = max(float(both.min().item()), 1e-3)
        hi = float(both.max().item())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_title("reuse estimator: predicted vs true idle gap")
    return fig


def load_runs(root: Path) -> tuple[list[tuple[str, pl.LazyFrame]], pl.DataFrame, pl.DataFrame]:
    """(labelled traces, per-request results of all, reuse gaps of all) under `root`."""
    traces, requests, gaps = [], [], []
    for trace_dir in find_traces(root):
        lf, meta = load_trace(trace_dir)
        tag = [pl.lit(meta.get("policy")).alias("policy"), pl.lit(meta.get("seed")).alias("seed")]
        traces.append((_label(meta, trace_dir, Path(root)), lf))
        requests.append(request_results(lf, meta).with_columns(tag))
        gaps.append(
            lf.filter(K == "reuse_gap")
            .select(
                (pl.col("value") / 1e6).alias("true gap s"),
                (pl.col("score") / 1e6).alias("predicted gap s"),
                *tag,
            )
            .collect()
        )
    if not traces:
        raise TraceError(f"{root}: no complete trace folder (trace/<policy>_seed<k>/meta.json)")
    return traces, pl.concat(requests), pl.concat(gaps)


def run_figures(root: Path, out_dir: Path, fmt: str = "png") -> list[Path]:
    """Draw and save the four run figures; returns their paths."""
    traces, requests, gaps = load_runs(root)
    return [
        _save(plot_vram(traces), out_dir, "vram_by_tier", fmt),
        _save(plot_latency_cdfs(requests), out_dir, "latency_cdfs", fmt),
        _save(plot_restore_by_class(requests), out_dir, "restore_by_class", fmt),
        _save(plot_gap_estimates(gaps), out_dir, "gap_estimates", fmt),
    ]


def metric_vs_param(
    frame: pl.DataFrame,
    metric: str,
    param: str,
    out_dir: Path,
    fmt: str = "png",
    hue: str = "policy",
) -> Path:
    """Save `fig_metric_vs_param` as `<metric>_vs_<param>.<fmt>`."""
    return _save(
        fig_metric_vs_param(frame, metric, param, hue), out_dir, f"{metric}_vs_{param}", fmt
    )


def fig_metric_vs_param(
    frame: pl.DataFrame, metric: str, param: str, hue: str = "policy"
) -> plt.Figure:
    """Mean of `metric` against `param` per policy, band = sd over seeds, dots = single seeds."""
    data = frame.select(param, metric, *([hue] if hue in frame.columns else [])).to_pandas()
    hue_arg = hue if hue in data.columns else None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=data, x=param, y=metric, hue=hue_arg, errorbar="sd", marker="o", ax=ax)
    sns.scatterplot(data=data, x=param, y=metric, hue=hue_arg, alpha=0.35, legend=False, ax=ax)
    ax.set_title(f"{metric} vs {param} (line: mean, band: sd over seeds)")
    return fig
