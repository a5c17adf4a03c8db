"""A one-page report of a sweep (or of any folder of runs): `report.md`, a self-contained
`report.html` (figure embedded as base64 PNG), `results.csv` (one row per job x policy x seed),
`headline_by_config.png` with its plotted numbers in `headline_by_config.csv`, and
`sweep_meta.json` (commands, versions, commit, wall time).

Configurations are the rows (the config keys that differ between runs as columns); seeds of one
configuration are pooled into a mean with its 95 % t interval, configurations never are.
Written by the sweep callback after a `--multirun` and by `cachepilot-sim report <folder>`.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from cachepilot_sim.experiment.intervals import MIN_SEEDS
from cachepilot_sim.experiment.report import STYLE, _html_table, git_commit, versions
from cachepilot_sim.experiment.runset import (
    CONFIG,
    HEADLINE,
    Run,
    RunSetError,
    cells_frame,
    differing_keys,
    find_runs,
    group_stats,
    paired_vs_lru,
    wrapped,
)
from cachepilot_sim.plotting import policy_colour

FIGURE = "headline_by_config"
METRICS = [m for m, _, _ in HEADLINE]
WRAP = 6  # configurations side by side; more start a new band of rows


def headline_data(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Long form of the headline figure: one row per (configuration, policy, metric) with the
    mean, the 95 % t half-width and `n`, the number of seeds pooled."""
    stats = group_stats(frame, [CONFIG, *keys, "policy"], METRICS)
    parts = [
        stats.select(
            CONFIG,
            *keys,
            "policy",
            "n",
            pl.lit(m).alias("metric"),
            pl.col(f"{m}_mean").alias("mean"),
            pl.col(f"{m}_ci").alias("ci95"),
        )
        for m in METRICS
    ]
    return pl.concat(parts)


def headline_figure(frame: pl.DataFrame, data: pl.DataFrame) -> Any:
    """Rows = metrics, columns = configurations (WRAP a band; the grid grows with more bands):
    policies side by side, bar = mean, whisker = 95 % t interval over seeds, dots = seeds; titles
    say n. Each metric has one y scale across configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(data[CONFIG].to_list()))
    policies = list(dict.fromkeys(frame["policy"].to_list()))
    ncols, bands = min(len(configs), WRAP), math.ceil(len(configs) / WRAP)
    nrows = len(HEADLINE) * bands
    fig, axes = plt.subplots(nrows, ncols, figsize=(0.9 + 3.4 * ncols, 2.9 * nrows), squeeze=False)
    for ax in axes.flat:  # a last band with fewer configurations leaves some empty
        ax.set_visible(False)
    for k, config in enumerate(configs):
        band, col = divmod(k, WRAP)
        cells = frame.filter(pl.col(CONFIG) == config)
        for m, (metric, label, _) in enumerate(HEADLINE):
            ax = axes[band * len(HEADLINE) + m][col]
            ax.set_visible(True)
            if k:  # one y scale per metric across every configuration
                ax.sharey(axes[m][0])
            part = data.filter((pl.col(CONFIG) == config) & (pl.col("metric") == metric))
            for i, policy in enumerate(policies):
                hit = part.filter(pl.col("policy") == policy)
                if hit.height == 0:
                    continue
                mean, half = hit["mean"][0], hit["ci95"][0]
                ax.bar(i, mean, color=policy_colour(policy), alpha=0.35, width=0.6)
                # The metrics drawn are non-negative: a whisker stops at 0, not below it.
                yerr = [[min(half, max(mean, 0.0))], [half]]
                ax.errorbar(i, mean, yerr=yerr, color="black", capsize=4, linewidth=1.1)
                seeds = cells.filter(pl.col("policy") == policy)[metric].to_numpy()
                ax.scatter([i] * seeds.size, seeds, color=policy_colour(policy), s=12, zorder=3)
            ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if col == 0:
                ax.set_ylabel(label, fontsize=9)
            if m == 0:
                n = sorted(set(part["n"].to_list()))
                ax.set_title(
                    f"{wrapped(config, 40)}\n(mean over n={'/'.join(map(str, n))} seeds)",
                    fontsize=8,
                )
    fig.suptitle("bar: mean, whisker: 95 % t interval over seeds, dots: seeds", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the suptitle
    return fig


def _fmt(mean: float, low: float, high: float, n: int) -> str:
    """`mean [low, high]` (the non-negative interval), or the mean alone under MIN_SEEDS seeds."""
    if mean is None or math.isnan(mean):
        return "n/a"
    if n < MIN_SEEDS or low is None or math.isnan(low):
        return f"{mean:.4g} (n={n})"
    return f"{mean:.4g} [{low:.4g}, {high:.4g}]"


def table_rows(frame: pl.DataFrame, keys: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the report table: one row per (configuration, policy)."""
    stats = group_stats(frame, [CONFIG, *keys, "policy"], METRICS)
    ratio = paired_vs_lru(frame)
    stats = stats.join(ratio, on=[CONFIG, "policy"], how="left", maintain_order="left")
    headers = [
        *keys,
        "policy",
        "seeds",
        *(f"{label} [95 % CI]" for _, label, _ in HEADLINE),
        "restore / LRU (paired)",
    ]
    rows = []
    for r in stats.iter_rows(named=True):
        cells = [str(r[k]) for k in keys] + [r["policy"], str(r["n"])]
        cells += [_fmt(r[f"{m}_mean"], r[f"{m}_low"], r[f"{m}_high"], r["n"]) for m in METRICS]
        cells.append(_fmt(r["ratio_mean"], r["ratio_low"], r["ratio_high"], r["ratio_n"] or 0))
        rows.append(cells)
    return headers, rows


def sweep_command(root: Path, runs: Sequence[Run]) -> str:
    """The sweep's command line, from Hydra's multirun.yaml, else the first job's run_meta."""
    try:
        saved = yaml.safe_load((root / "multirun.yaml").read_text())
        over = saved["hydra"]["overrides"]
        args = [a for a in over.get("hydra", []) if a != "hydra.mode=MULTIRUN"] + over["task"]
        return " ".join(["cachepilot-sim", "--multirun", *args])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        commands = [r.meta.get("command") for r in runs if r.meta.get("command")]
        return str(commands[0]) if commands else "unknown"


def sweep_meta(root: Path, runs: Sequence[Run], keys: Sequence[str]) -> dict[str, Any]:
    """Commands, versions, commits, and wall time: the jobs' sum and first start to last end."""
    starts, ends, wall = [], [], 0.0
    for r in runs:
        if "started_utc" in r.meta and "wall_s" in r.meta:
            t0 = datetime.fromisoformat(r.meta["started_utc"]).timestamp()
            starts.append(t0)
            ends.append(t0 + float(r.meta["wall_s"]))
            wall += float(r.meta["wall_s"])
    commits = sorted({str(r.meta.get("commit", "unknown")) for r in runs})
    return {
        "command": sweep_command(root, runs),
        "differing_keys": list(keys),
        "jobs": [{"job": r.name, "command": r.meta.get("command", "")} for r in runs],
        "commit": git_commit(Path(__file__).resolve().parent),
        "job_commits": commits,
        "versions": versions(),
        # Every engine label among the runs: how far each configuration's numbers can be trusted.
        "trust": sorted({r.trust or "not recorded (a run from before trust labels)" for r in runs}),
        # What the jobs simulated (traffic, serving setup, SLA), each distinct line once.
        "question": list(
            dict.fromkeys(line for r in runs for line in r.meta.get("question", [])[:3])
        ),  # fmt: skip
        "jobs_wall_s": round(wall, 3),
        "span_s": round(max(ends) - min(starts), 3) if starts else None,
    }


def _write(path: Path, text: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.replace(tmp, path)


def write_sweep_report(root: Path) -> list[Path]:
    """Everything in the module docstring, at `root`; returns the paths written."""
    root = Path(root)
    if (root / "metrics.json").is_file():
        raise RunSetError(f"{root}: a run folder (its own report.md is written by the run)")
    runs = find_runs(root)
    if not runs:
        raise RunSetError(f"{root}: no run folder (none holds metrics.json)")
    keys = differing_keys(runs)
    frame = cells_frame(runs, keys)
    data = headline_data(frame, keys)
    import matplotlib.pyplot as plt

    fig = headline_figure(frame, data)
    fig.savefig(root / f"{FIGURE}.png.tmp", dpi=100, format="png")
    plt.close(fig)
    os.replace(root / f"{FIGURE}.png.tmp", root / f"{FIGURE}.png")
    _write(root / f"{FIGURE}.csv", data.write_csv())
    _write(root / "results.csv", frame.drop(CONFIG).write_csv())
    meta = sweep_meta(root, runs, keys)
    _write(root / "sweep_meta.json", json.dumps(meta, indent=1) + "\n")
    headers, rows = table_rows(frame, keys)
    md, page = _pages(root, meta, headers, rows, len(runs))
    _write(root / "report.md", md)
    _write(root / "report.html", page)
    names = ("report.md", "report.html", "results.csv", "sweep_meta.json", f"{FIGURE}.png")
    return [root / n for n in (*names, f"{FIGURE}.csv")]


def _pages(
    root: Path, meta: dict[str, Any], headers: list[str], rows: list[list[str]], num_runs: int
) -> tuple[str, str]:
    title = f"Sweep {root.name}: {num_runs} runs, configurations differ in " + (
        ", ".join(meta["differing_keys"]) or "nothing (one configuration)"
    )
    facts = [
        ("command", meta["command"]),
        ("commit (report)", meta["commit"]),
        ("commits (jobs)", ", ".join(meta["job_commits"])),
        (
            "wall time",
            f"{meta['jobs_wall_s']:.1f} s over all jobs, first start to last end "
            f"{meta['span_s'] if meta['span_s'] is not None else 'unknown'} s",
        ),
        ("versions", ", ".join(f"{k} {v}" for k, v in meta["versions"].items())),
    ]
    note = (
        "Seeds of one configuration are pooled: the table gives the mean [95 % percentile "
        "bootstrap interval] (never below 0; the figure's whiskers are the t interval, stopped "
        "at 0); configurations are never pooled. The paired ratio divides each seed's realized "
        "restore by LRU's on the same configuration and seed (n/a without LRU or when LRU "
        "restored nothing)."
    )
    seeds = [int(r[headers.index("seeds")]) for r in rows]
    if seeds and min(seeds) < MIN_SEEDS:
        note += (
            f" n too small for an interval: some configurations have {min(seeds)} seed(s) "
            f"(marked n=...), under the {MIN_SEEDS} an interval needs; run more seeds before "
            "ranking them."
        )
    trust = [f"Trust: {t}" for t in meta.get("trust", [])]
    asked = [f"{line}  " for line in meta.get("question", [])]
    md = [f"# {title}", "", *asked, "", *trust, "", f"![headline by configuration]({FIGURE}.png)"]
    md += ["", note]
    md.append("")
    md += ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    md += [f"- {k}: `{v}`" for k, v in facts] + ["", "Jobs:", ""]
    md += [f"- `{j['job']}`" for j in meta["jobs"]]
    png = base64.b64encode((root / f"{FIGURE}.png").read_bytes()).decode("ascii")
    page = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(line)}</p>" for line in meta.get("question", [])),
        *(f"<p><b>Trust:</b> {html.escape(t.removeprefix('Trust: '))}</p>" for t in trust),
        f"<img alt='headline by configuration' src='data:image/png;base64,{png}'>",
        f"<p>{html.escape(note)}</p>",
        _html_table(headers, rows),
        "<ul>",
        *(f"<li>{k}: <code>{html.escape(str(v))}</code></li>" for k, v in facts),
        "</ul><h3>Jobs</h3><ul>",
        *(f"<li><code>{html.escape(j['job'])}</code></li>" for j in meta["jobs"]),
        "</ul></body></html>",
    ]
    return "\n".join(md) + "\n", "\n".join(page) + "\n"
