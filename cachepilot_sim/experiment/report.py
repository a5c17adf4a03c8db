"""A one-page report of a run: `report.md` and a self-contained `report.html` (figure embedded as
base64 PNG), `results.csv` (one row per policy x seed) and `run_meta.json` (command, config,
versions, commit, wall time).

The headline figure puts the policies side by side on realized restore time, TTFT p99 and goodput:
each seed as a dot, the mean with its 95 % percentile bootstrap interval over seeds (never below 0;
none under three seeds) as a bar. Reading the wall clock
and git here is for the record of the run, never for the simulated model.
"""

from __future__ import annotations

import base64
import html
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from cachepilot_sim.experiment.answer import answer_sections
from cachepilot_sim.experiment.intervals import MIN_SEEDS, nonnegative_interval
from cachepilot_sim.plotting import policy_palette, top_k

# (column of results.csv, panel title) of the headline figure.
HEADLINE = (
    ("realized_restore_s", "realized restore, s (lower is better)"),
    ("ttft_p99_ms", "TTFT p99, ms (lower is better)"),
    ("goodput_req_s", "goodput, req/s (higher is better)"),
)
PACKAGES = ("cachepilot-sim", "simpy", "numpy", "scipy", "polars", "hydra-core", "omegaconf")
HEADLINE_TOP_K = 6  # more policies: the 6 with the lowest TTFT p99 coloured, the rest grey
CELL_KEYS = ("realized_restore_s", "evictions", "goodput_req_s", "sla_attainment", "duration_s")


def results_frame(
    cells: Sequence[dict[str, Any]], serving: Sequence[dict[str, float]]
) -> pl.DataFrame:
    """One row per (policy, seed): the headline run metrics, then the serving statistics."""
    rows = [
        {"policy": c["policy"], "seed": c["seed"], **{k: c[k] for k in CELL_KEYS if k in c}, **s}
        for c, s in zip(cells, serving, strict=True)
    ]
    return pl.DataFrame(rows)


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (0 for one value or no spread)."""
    mean = float(np.mean(values))
    if values.size < 2 or float(np.std(values)) == 0.0:
        return mean, 0.0
    low, _ = stats.t.interval(0.95, values.size - 1, loc=mean, scale=stats.sem(values))
    return mean, mean - float(low)


def headline_figure(results: pl.DataFrame, path: Path) -> Path:
    """Policies side by side on each HEADLINE metric: seeds as dots, the mean as a bar with its
    95 % bootstrap interval (intervals.nonnegative_interval; none under three seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(results["policy"].to_list()))
    # Many policies: best TTFT p99 first, the top HEADLINE_TOP_K in their colours, the rest grey.
    p99 = {p: float(results.filter(pl.col("policy") == p)["ttft_p99_ms"].mean() or 0.0)  # type: ignore[arg-type]
           for p in policies}  # fmt: skip
    if len(policies) > HEADLINE_TOP_K:
        policies = sorted(policies, key=lambda p: (p99[p], p))
    palette = policy_palette(policies, top_k(p99, HEADLINE_TOP_K))
    width = max(4.2, 0.35 * len(policies))
    fig, axes = plt.subplots(1, len(HEADLINE), figsize=(width * len(HEADLINE), 3.6))
    x = np.arange(len(policies))
    for ax, (key, title) in zip(axes, HEADLINE, strict=True):
        for i, policy in enumerate(policies):
            values = results.filter(pl.col("policy") == policy)[key].to_numpy()
            ci = nonnegative_interval(values)  # non-negative metrics: whiskers never below 0
            ax.bar(i, ci.mean, color=palette[policy], alpha=0.35, width=0.6)
            if ci.known:
                yerr = [[ci.mean - ci.low], [ci.high - ci.mean]]
                ax.errorbar(i, ci.mean, yerr=yerr, color="black", capsize=5, linewidth=1.2)
            ax.scatter(np.full(values.size, i), values, color=palette[policy], s=14, zorder=3)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(x, policies, rotation=30 if len(policies) > 4 else 0, ha="right"
                      if len(policies) > 4 else "center")  # fmt: skip
        ax.grid(axis="y", alpha=0.3)
    num_seeds = results.filter(pl.col("policy") == policies[0]).height
    if num_seeds < MIN_SEEDS:
        what = f"mean of {num_seeds} seed(s): n too small for an interval, none drawn (dots: seeds)"
    else:
        what = f"mean and 95 % percentile bootstrap interval over {num_seeds} seeds (dots: seeds)"
    fig.suptitle(what, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def git_commit(repo_dir: Path) -> str:
    """`<sha>` (`-dirty` when the tree has changes) of the checkout holding the package, or
    `unknown` for an installed package."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("-dirty" if dirty else "")) if sha else "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run_meta(config_yaml: str, title: str, wall_s: float, started: str) -> dict[str, Any]:
    """What run_meta.json records: command, config, versions, commit, wall time (the runner adds
    `trust`, the engine label of trust.py, which report.md shows under its title)."""
    return {
        "title": title,
        "command": " ".join(["cachepilot-sim", *sys.argv[1:]]),
        "argv": sys.argv,
        "started_utc": started,
        "wall_s": round(wall_s, 3),
        "commit": git_commit(Path(__file__).resolve().parent),
        "versions": versions(),
        "platform": platform.platform(),
        "config_yaml": config_yaml,
    }


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(' '.join(h.split()))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}"
    "td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:.6em;"
    "overflow:auto;font-size:.85em}img{max-width:100%}"
)


def write_report(
    out_dir: Path, rows: Sequence[Any], baseline: str, results: pl.DataFrame, meta: dict[str, Any]
) -> list[Path]:
    """results.csv, run_meta.json, headline.png, report.md and report.html under out_dir."""
    results.write_csv(out_dir / "results.csv")
    (out_dir / "run_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    figure = headline_figure(results, out_dir / "headline.png")
    sections = answer_sections(rows, baseline)
    facts = [
        ("command", meta["command"]),
        ("commit", meta["commit"]),
        ("started (UTC)", meta["started_utc"]),
        ("wall time", f"{meta['wall_s']:.1f} s"),
        ("versions", ", ".join(f"{k} {v}" for k, v in meta["versions"].items())),
    ]
    trust = str(meta.get("trust", "not recorded"))
    asked = [line for line in meta.get("question", []) if not line.startswith("trust: ")]
    ranked = meta.get("ranking")
    if ranked:  # the answer to "which policy", on the metric asked, first
        sections = [(f"Ranking: {ranked['lines'][-1]}", ranked["headers"], ranked["rows"]),
                    *sections]  # fmt: skip
    md = [f"# {meta['title']}", ""]
    md += [f"{line}  " for line in asked]
    md += [f"- {line}" for line in (ranked or {}).get("lines", [])[:-1]]
    md += [
        "",
        f"**Trust:** {trust}",
        "",
        f"![headline figure]({figure.name})",
        "",
    ]
    for heading, headers, body in sections:
        md += [f"**{heading}**", "", "| " + " | ".join(" ".join(h.split()) for h in headers) + " |",
               "|---|" + "---:|" * (len(headers) - 1)]  # fmt: skip
        md += ["| " + " | ".join(r) + " |" for r in body] + [""]
    md += [f"- {k}: `{v}`" for k, v in facts]
    md += ["", "Config (composed, resolved):", "", "```yaml", meta["config_yaml"].rstrip(), "```"]
    (out_dir / "report.md").write_text("\n".join(md) + "\n")
    png = base64.b64encode(figure.read_bytes()).decode("ascii")
    page = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(meta['title'])}"
            f"</title><style>{STYLE}</style></head><body><h1>{html.escape(meta['title'])}</h1>",
            *(f"<p>{html.escape(line)}</p>" for line in asked),
            *(f"<p>{html.escape(line)}</p>" for line in (ranked or {}).get("lines", [])[:-1]),
            f"<p><b>Trust:</b> {html.escape(trust)}</p>",
            f"<img alt='headline figure' src='data:image/png;base64,{png}'>"]  # fmt: skip
    for heading, headers, body in sections:
        page += [f"<h3>{html.escape(heading)}</h3>", _html_table(headers, body)]
    page += [
        "<ul>",
        *(f"<li>{k}: <code>{html.escape(str(v))}</code></li>" for k, v in facts),
        "</ul><h3>Config</h3>",
        f"<pre>{html.escape(meta['config_yaml'])}</pre></body></html>",
    ]
    (out_dir / "report.html").write_text("\n".join(page) + "\n")
    return [out_dir / n for n in ("report.md", "report.html", "results.csv", "run_meta.json")]
