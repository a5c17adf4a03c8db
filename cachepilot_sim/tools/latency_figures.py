"""Latency CDFs of a run or a sweep (tools/figures.py's figure family): TTFT and TPOT, one column
per configuration, seeds pooled. Policies whose curves lie on top of each other cannot be read
apart on a CDF: when every shown policy's quantiles are within OVERLAP_PCT of the baseline's (LRU
where it ran), a row under each CDF draws each policy's quantile as a difference to the
baseline's, in per cent, over the percentile (logit axis: the tail gets room)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from cachepilot_sim.experiment.runset import CONFIG, wrapped
from cachepilot_sim.plotting import GREY, lowest_ttft_p99, style

TOP_K = 6  # CDFs of more policies colour the k with the lowest TTFT p99, the rest thin and grey
METRICS = ("TTFT s", "TPOT ms")
# Curves closer than this everywhere between the 5th and 99th percentile "overlap".
OVERLAP_PCT = 10.0
# Percentiles of the difference rows: the body evenly, the tail to p99.9.
LEVELS = np.unique(np.concatenate([np.linspace(0.01, 0.9, 30), 1 - np.logspace(-1, -3, 21)]))
BODY = (LEVELS >= 0.05) & (LEVELS <= 0.99)


def _configs(frame: pl.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame[CONFIG].to_list()))


def latency_cdf_data(requests: pl.DataFrame) -> pl.DataFrame:
    """ECDF points per (configuration, policy) over completed requests of all its seeds: metric
    (`TTFT s`, `TPOT ms`), value, ecdf, n_seeds, n_requests. Values <= 0 cannot sit on a log axis
    and are left out (counted in `n_requests`, so the curve then ends below 1)."""
    done = requests.filter(pl.col("outcome") == "completed")
    parts = []
    for metric, expr, rows in (
        ("TTFT s", pl.col("ttft_us") / 1e6, done),
        ("TPOT ms", pl.col("tpot_us") / 1e3, done.filter(pl.col("generated") > 1)),
    ):
        for (config, policy), part in rows.group_by(CONFIG, "policy", maintain_order=True):
            values = np.sort(part.select(expr).to_series().drop_nulls().to_numpy())
            n = values.size
            keep = values > 0
            parts.append(
                pl.DataFrame(
                    {
                        CONFIG: config,
                        "policy": policy,
                        "metric": metric,
                        "value": values[keep],
                        "ecdf": (np.arange(1, n + 1) / max(n, 1))[keep],
                        "n_seeds": part["seed"].n_unique(),
                        "n_requests": n,
                    }
                )
            )
    return pl.concat(parts) if parts else pl.DataFrame()


def baseline_policy(policies: list[str]) -> str:
    """The policy the differences are taken to: LRU where it ran, else the first listed."""
    return "lru" if "lru" in policies else policies[0]


def quantiles(points: pl.DataFrame) -> np.ndarray:
    """The ECDF's quantile at each of LEVELS: the first value whose ECDF reaches the level."""
    ecdf = points["ecdf"].to_numpy()
    at = np.minimum(np.searchsorted(ecdf, LEVELS, side="left"), ecdf.size - 1)
    return points["value"].to_numpy()[at]


def quantile_differences(data: pl.DataFrame, baseline: str) -> pl.DataFrame:
    """Per (configuration, metric, policy other than `baseline`): at each of LEVELS, 100 x (the
    policy's quantile / the baseline's - 1). Columns: config, policy, metric, baseline, quantile,
    difference_pct."""
    parts = []
    for (config, metric), group in data.group_by(CONFIG, "metric", maintain_order=True):
        base = group.filter(pl.col("policy") == baseline)
        if base.height == 0:
            continue
        ref = quantiles(base)
        for (policy,), d in group.group_by("policy", maintain_order=True):
            if policy == baseline or d.height == 0:
                continue
            parts.append(
                pl.DataFrame(
                    {
                        CONFIG: config,
                        "policy": policy,
                        "metric": metric,
                        "baseline": baseline,
                        "quantile": LEVELS,
                        "difference_pct": 100.0 * (quantiles(d) / ref - 1.0),
                    }
                )
            )
    return pl.concat(parts) if parts else pl.DataFrame()


def overlapping(diffs: pl.DataFrame, shown: set[str]) -> bool:
    """Every shown policy within OVERLAP_PCT of the baseline from p5 to p99, in every panel."""
    if diffs.height == 0:
        return False
    body = set(LEVELS[BODY].tolist())
    d = diffs.filter(pl.col("policy").is_in(list(shown)) & pl.col("quantile").is_in(list(body)))
    return d.height > 0 and float(d["difference_pct"].abs().max()) < OVERLAP_PCT  # type: ignore[arg-type]


def latency_cdfs(requests: pl.DataFrame) -> tuple[plt.Figure, pl.DataFrame]:
    """TTFT and TPOT CDFs, one column per configuration, log x; each policy has its own colour,
    line style and marker; the legend gives seeds pooled and requests. When the curves overlap
    (`overlapping`), each CDF row is followed by the differences to the baseline; the data then
    holds those rows too (`baseline`, `quantile`, `difference_pct`)."""
    data = latency_cdf_data(requests)
    configs = _configs(requests)
    policies = list(dict.fromkeys(requests["policy"].to_list()))
    shown = set(policies) if len(policies) <= TOP_K else set(lowest_ttft_p99(requests, TOP_K))
    baseline = baseline_policy(policies)
    diffs = quantile_differences(data, baseline) if len(policies) > 1 else pl.DataFrame()
    with_diffs = overlapping(diffs, shown - {baseline})
    rows = 4 if with_diffs else 2
    fig, axes = plt.subplots(
        rows, len(configs), figsize=(1 + 5 * len(configs), 3.75 * rows), squeeze=False
    )
    for col, config in enumerate(configs):
        for m, metric in enumerate(METRICS):
            ax = axes[m * (rows // 2)][col]
            _cdf_panel(ax, data.filter((pl.col(CONFIG) == config) & (pl.col("metric") == metric)),
                       policies, shown)  # fmt: skip
            ax.set_xlabel(f"{metric} (log)")
            ax.set_title(f"{wrapped(config)}: {metric.split()[0]} CDF", fontsize=9)
            if with_diffs:
                d = diffs.filter((pl.col(CONFIG) == config) & (pl.col("metric") == metric))
                _difference_panel(axes[m * 2 + 1][col], d, policies, shown, baseline)
                axes[m * 2 + 1][col].set_ylabel(f"{metric.split()[0]} vs {baseline} (%)")
    fig.tight_layout()
    if with_diffs:
        data = pl.concat([data, diffs], how="diagonal")
    return fig, data


def _cdf_panel(ax: plt.Axes, data: pl.DataFrame, policies: list[str], shown: set[str]) -> None:
    for i, policy in enumerate(policies):
        d = data.filter(pl.col("policy") == policy)
        if d.height == 0:
            continue
        label = f"{policy} (n={d['n_seeds'][0]} seeds, {d['n_requests'][0]} req)"
        if policy not in shown:  # beyond the top k: context, not a curve to read
            ax.step(d["value"], d["ecdf"], where="post", lw=0.7, color=GREY, alpha=0.6)
            continue
        ax.step(d["value"], d["ecdf"], where="post", label=label, lw=1.3,
                markevery=max(d.height // 8, 1), ms=5, **style(i, policy))  # type: ignore[arg-type]  # fmt: skip
    if len(shown) < len(policies):
        ax.plot([], [], color=GREY, lw=0.7, label=f"{len(policies) - len(shown)} others")
    ax.set_xscale("log")
    ax.set_ylabel("fraction of completed requests")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")


def _difference_panel(
    ax: plt.Axes, diffs: pl.DataFrame, policies: list[str], shown: set[str], baseline: str
) -> None:
    """Each shown policy's quantile over the baseline's, in per cent, against the percentile."""
    base = style(policies.index(baseline), baseline)
    label = f"{baseline} (baseline)"
    ax.axhline(0.0, lw=1.3, color=base["color"], ls=base["linestyle"], label=label)  # type: ignore[arg-type]
    for i, policy in enumerate(policies):
        d = diffs.filter(pl.col("policy") == policy)
        if policy == baseline or policy not in shown or d.height == 0:
            continue
        ax.plot(d["quantile"], d["difference_pct"], lw=1.3, ms=4, markevery=5,
                label=policy, **style(i, policy))  # type: ignore[arg-type]  # fmt: skip
    ax.set_xscale("logit")
    ax.set_xlabel(f"percentile (curves within {OVERLAP_PCT:g} %: differences drawn)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")


def plot_latency_cdfs(requests: pl.DataFrame) -> plt.Figure:
    """latency_cdfs without its data."""
    return latency_cdfs(requests)[0]
