"""Figures of a run or a sweep from the event traces, grouped by configuration (one function per
figure, each returning the figure and the exact numbers it draws).

Traces are labelled by the config keys that differ between the runs (experiment/runset.py):
each configuration is a column of panels, policies are hues with their own line style and marker,
seeds of one configuration are pooled (n shown), configurations never are. VRAM by tier draws the
GPU and the CPU tier on their own axes, one row per trace, paginated (`vram_pages`) rather than
cut. `tools/plot.py` saves each figure with its data beside it (`<name>.csv`); the notebooks in
notebooks/ draw them inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import seaborn as sns

from cachepilot_sim.experiment.outdir import hidden
from cachepilot_sim.experiment.runset import (
    CONFIG,
    RunSetError,
    check_no_pooling,
    differing_keys,
    find_runs,
    group_stats,
    run_labels,
    wrapped,
)
from cachepilot_sim.plotting import policy_palette, seaborn_data, style
from cachepilot_sim.tools.latency_figures import (  # noqa: F401 - the figures of a run, in one place
    TOP_K,
    latency_cdf_data,
    latency_cdfs,
    plot_latency_cdfs,
)
from cachepilot_sim.trace.derive import TraceError, load_trace, request_results
from cachepilot_sim.trace.recorder import META_FILE

K = pl.col("kind")
TRACES_PER_PAGE = 6  # rows of the VRAM figure per file; more traces make more pages


class TraceRun(NamedTuple):
    """One trace folder with its configuration's label, policy and seed."""

    label: str
    lf: pl.LazyFrame
    config: str
    policy: str
    seed: int
    kv_pool_gb: float = float("nan")  # the GPU KV pool's capacity (meta.json), drawn as a line


def find_traces(root: Path) -> list[Path]:
    """Complete trace folders under `root` (each holds meta.json, written last by a run)."""
    root = Path(root)
    if (root / META_FILE).exists():
        return [root]
    found = root.rglob(META_FILE)  # not in a run's staging or trash folder (outdir.py)
    return sorted(
        p.parent for p in found if p.parent.parent.name == "trace" and not hidden(p, root)
    )


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


def _gpu_evictions(lf: pl.LazyFrame) -> pl.DataFrame:
    # GPU evictions only (a cpu-tier evict_drop is the CPU store making room), as in the metrics.
    gpu = (K == "evict_offload") | ((K == "evict_drop") & (pl.col("tier") != "cpu"))
    return lf.filter(gpu).select((pl.col("t_us") / 1e6).alias("time_s")).collect()


def vram_figure(traces: Sequence[TraceRun]) -> tuple[plt.Figure, pl.DataFrame]:
    """One row per trace: GB on the GPU (left, evictions as red ticks) and in the CPU store and in
    flight (right), each on its own y scale. Data: trace, tier (gpu, cpu, flight, eviction),
    time_s, GB (0 for an eviction)."""
    fig, axes = plt.subplots(
        len(traces),
        2,
        figsize=(12, 2.5 * len(traces)),
        squeeze=False,
        sharex=True,
        gridspec_kw={"width_ratios": [3, 2]},
    )
    parts = []
    for (gpu_ax, cpu_ax), run in zip(axes, traces, strict=True):
        line = tier_timeline(run.lf).select("tier", "time_s", "GB")
        ev = _gpu_evictions(run.lf)
        line = pl.concat(
            [
                line,
                ev.with_columns(pl.lit("eviction").alias("tier"), pl.lit(0.0).alias("GB")).select(
                    line.columns
                ),
            ]
        )
        parts.append(
            line.with_columns(
                pl.lit(run.label).alias("trace"),
                pl.lit(run.config).alias(CONFIG),
                pl.lit(run.policy).alias("policy"),
                pl.lit(run.seed).alias("seed"),
            )
        )
        for ax, tiers in ((gpu_ax, ("gpu",)), (cpu_ax, ("cpu", "flight"))):
            for tier, ls in zip(tiers, ("-", "--"), strict=False):
                t = line.filter(pl.col("tier") == tier)
                ax.step(t["time_s"], t["GB"], where="post", linestyle=ls, label=tier, lw=1.1)
            ax.set_ylabel("GB")
            ax.set_ylim(bottom=0)
        if np.isfinite(run.kv_pool_gb):  # the pool's capacity: how close to full it ran
            gpu_ax.axhline(run.kv_pool_gb, color="black", lw=0.8, ls=":", label="KV pool capacity")
        gpu_ax.plot(
            ev["time_s"],
            np.zeros(ev.height),
            "|",
            color="crimson",
            ms=10,
            label=f"evictions ({ev.height})",
        )
        gpu_ax.set_title(f"{wrapped(run.label, 90)}: GPU KV pool (used + in flight)", fontsize=8)
        cpu_ax.set_title("CPU store and copies in flight", fontsize=8)
        gpu_ax.legend(loc="upper left", fontsize=7)
        cpu_ax.legend(loc="upper left", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("time, s")
    fig.tight_layout()
    return fig, pl.concat(parts)


def vram_pages(
    traces: Sequence[TraceRun], per_page: int = TRACES_PER_PAGE
) -> list[tuple[plt.Figure, pl.DataFrame]]:
    """vram_figure over consecutive pages of `per_page` traces: every trace is drawn."""
    return [vram_figure(traces[i : i + per_page]) for i in range(0, len(traces), per_page)]


def plot_vram(traces: Sequence[TraceRun]) -> plt.Figure:
    """vram_figure of every trace given, on one figure."""
    return vram_figure(traces)[0]


def _configs(frame: pl.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame[CONFIG].to_list()))


def restore_by_class(requests: pl.DataFrame) -> tuple[plt.Figure, pl.DataFrame]:
    """Realized restore seconds (reload + recompute) per workload class and policy, one panel per
    configuration: bar = mean over seeds, whisker = 95 % t interval; data has n (seeds)."""
    per_seed = requests.group_by(
        CONFIG, "policy", "seed", "workload_class", maintain_order=True
    ).agg(((pl.col("reload_us") + pl.col("recompute_us")).sum() / 1e6).alias("restore_s"))
    data = group_stats(per_seed, [CONFIG, "policy", "workload_class"], ["restore_s"])
    configs = _configs(requests)
    policies = list(dict.fromkeys(requests["policy"].to_list()))
    classes = sorted(set(data["workload_class"].to_list()))
    fig, axes = plt.subplots(
        1, len(configs), figsize=(1 + 6 * len(configs), 4), squeeze=False, sharey=True
    )
    width = 0.8 / max(len(policies), 1)
    for ax, config in zip(axes[0], configs, strict=True):
        n = set()
        for i, policy in enumerate(policies):
            d = data.filter((pl.col(CONFIG) == config) & (pl.col("policy") == policy))
            x = [
                classes.index(c) + (i - (len(policies) - 1) / 2) * width
                for c in d["workload_class"]
            ]
            ax.bar(
                x,
                d["restore_s_mean"],
                width,
                yerr=d["restore_s_ci"],
                capsize=3,
                label=policy,
                color=style(i, policy)["color"],
                hatch=("", "//", "..", "xx")[i % 4],
            )
            n |= set(d["n"].to_list())
        ax.set_xticks(range(len(classes)), classes)
        ax.set_title(
            f"{wrapped(config)}\n(mean over n={'/'.join(map(str, sorted(n)))} seeds, "
            "whisker: 95 % t interval)",
            fontsize=8,
        )
        ax.set_ylabel("realized restore, s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, data


def plot_restore_by_class(requests: pl.DataFrame) -> plt.Figure:
    """restore_by_class without its data."""
    return restore_by_class(requests)[0]


def gap_estimates(gaps: pl.DataFrame) -> tuple[plt.Figure, pl.DataFrame]:
    """Predicted gap (1/lambda of the reuse estimator) against the true gap, log-log, one panel
    per configuration; the data are the points drawn."""
    configs = _configs(gaps) if gaps.height else ["no returning session"]
    fig, axes = plt.subplots(1, len(configs), figsize=(0.5 + 5 * len(configs), 5), squeeze=False)
    for ax, config in zip(axes[0], configs, strict=True):
        d = gaps.filter(pl.col(CONFIG) == config) if gaps.height else gaps
        if d.height:
            sns.scatterplot(
                data=seaborn_data(d),
                x="true gap s",
                y="predicted gap s",
                hue="policy",
                style="policy",
                palette=policy_palette(d["policy"].unique(maintain_order=True).to_list()),
                s=14,
                alpha=0.6,
                ax=ax,
            )
            both = d.select(pl.concat_list("true gap s", "predicted gap s").explode())
            lo, hi = max(float(both.min().item()), 1e-3), float(both.max().item())
            ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_title(f"{wrapped(config)}: predicted vs true idle gap", fontsize=9)
    fig.tight_layout()
    return fig, gaps


def plot_gap_estimates(gaps: pl.DataFrame) -> plt.Figure:
    """gap_estimates without its data."""
    return gap_estimates(gaps)[0]


def load_runs(
    root: Path, keys: Sequence[str] | None = None
) -> tuple[list[TraceRun], pl.DataFrame, pl.DataFrame]:
    """(traces, per-request results of all, reuse gaps of all) under `root`, each labelled with
    its configuration (`config` column: the differing keys, or `keys` when given)."""
    root = Path(root)
    try:
        runs = find_runs(root)
        keys = differing_keys(runs) if keys is None else keys
    except RunSetError as err:
        raise TraceError(str(err)) from err
    labels = {r.dir: run_labels(runs, keys)[r.name] for r in runs}
    only = [root] if (root / META_FILE).exists() else None
    traces, requests, gaps = [], [], []
    for run_dir, config in labels.items():
        for trace_dir in only or sorted(p.parent for p in run_dir.glob(f"trace/*/{META_FILE}")):
            lf, meta = load_trace(trace_dir)
            policy, seed = str(meta.get("policy", trace_dir.name)), int(meta.get("seed", -1))
            tag = [
                pl.lit(v).alias(k)
                for k, v in ((CONFIG, config), ("policy", policy), ("seed", seed))
            ]
            label = f"{config} · {policy} s{seed}" if len(labels) > 1 else f"{policy} s{seed}"
            pool_gb = float(meta.get("kv_pool_bytes", float("nan"))) / 1e9
            traces.append(TraceRun(label, lf, config, policy, seed, pool_gb))
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
        if only:
            break
    if not traces:
        raise TraceError(f"{root}: no complete trace folder (trace/<policy>_seed<k>/meta.json)")
    order = list(labels.values())
    traces.sort(key=lambda t: (order.index(t.config), t.policy, t.seed))
    index = pl.DataFrame(
        [{CONFIG: t.config, "policy": t.policy, "seed": t.seed, "job": t.label} for t in traces]
    )
    try:
        check_no_pooling(index, [CONFIG, "policy"], [])
    except RunSetError as err:
        raise TraceError(str(err)) from err
    return traces, pl.concat(requests, how="diagonal_relaxed"), pl.concat(gaps)
