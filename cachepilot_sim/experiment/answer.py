"""The terminal answer of a run: rich tables sized to the terminal, the same as markdown, and a
`vllm bench serve`-style block for a run of one cell.

At 120 columns or more: an outcome table (restore time, ratio to the baseline with its 95 %
interval, evictions, goodput, throughput) and a latency table (TTFT, TPOT, ITL, E2E: mean, p50,
p99 in ms), one row per policy, when they fit at their natural width. Otherwise the outcome
table is split in two and latency is stacked (one row per policy and latency). Numeric columns
never wrap, so no number is ever cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from cachepilot_sim.experiment.intervals import MIN_SEEDS
from cachepilot_sim.experiment.ranking import SPECS, Ranking, ranking_cells, ranking_lines
from cachepilot_sim.experiment.serving import LATENCIES, STATS, PolicyRow

WIDE_COLUMNS = 120  # below this many terminal columns, tables are split and stacked
LATENCY_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# Policy-lab and replay metrics shown when the cells have them: (metric key, header, format).
EXTRA_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("oracle_gap_mean", "vs oracle\ngap mean", "{:.3f}"),
    ("offline_lp_restore_s", "offline LP\nbound s", "{:.2f}"),
    ("prefix_hit_ratio", "prefix-hit\nratio", "{:.3f}"),
)
NOTE = (
    "Means over seeds. Restore: seconds of KV reload + recompute that returning sessions waited "
    "for (± sample σ). vs {base}: restore time / {base}'s on the same seed, with its 95 % "
    "percentile bootstrap interval over seeds (never below 0; n<3: too few seeds for an "
    "interval, none shown). Goodput: requests meeting their TTFT and TPOT targets per second. "
    "Latency in ms over completed requests (ITL: every output token's gap since its request's "
    "previous token)."
)


def fmt_ms(value: float) -> str:
    """Milliseconds with 3 significant figures below 100 ms, whole ms (with ,) above."""
    if math.isnan(value):
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _num(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else fmt.format(value)


def outcome_cells(row: PolicyRow, extras: Sequence[tuple[str, str, str]]) -> list[str]:
    """policy, restore, ratio, CI, evictions, goodput, req/s, tok/s, extras: formatted."""
    restore = f"{row.restore_mean_s:.2f}"
    if row.num_seeds > 1:
        restore += f" ± {row.restore_std_s:.2f}"
    r = row.ratio
    if r.num_seeds and r.num_seeds < MIN_SEEDS:
        ci = f"n={r.num_seeds}<{MIN_SEEDS}"
    else:
        ci = "-" if math.isnan(r.low) else f"[{r.low:.3f}, {r.high:.3f}]"
    s = row.serving
    return [
        row.policy,
        restore,
        _num(r.mean, "{:.3f}"),
        ci,
        _num(row.evictions, "{:,.0f}"),
        _num(row.goodput_req_s, "{:.3f}"),
        _num(s["request_throughput_req_s"], "{:.3f}"),
        _num(s["output_throughput_tok_s"], "{:,.1f}"),
        *(_num(row.extras.get(k, math.nan), fmt) for k, _, fmt in extras),
    ]


def outcome_headers(baseline: str, extras: Sequence[tuple[str, str, str]]) -> list[str]:
    return [
        "policy",
        "restore s\n(KV reload\n+ recompute)",
        f"vs {baseline}\n(ratio)",
        "95 % CI\nof ratio",
        "evictions",
        "goodput\nreq/s",
        "throughput\nreq/s",
        "output\ntok/s",
        *(header for _, header, _ in extras),
    ]


def latency_headers() -> list[str]:
    return [f"{LATENCY_TITLES[n]}\n{s}" for n, _, _ in LATENCIES for s in STATS]


def latency_cells(row: PolicyRow) -> list[str]:
    return [fmt_ms(row.serving[f"{n}_{s}_ms"]) for n, _, _ in LATENCIES for s in STATS]


def _table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], num_labels: int = 1
) -> Table:
    # Titles, headers and cells are plain text: "[h100_sxm: derived, not measured]" or a policy
    # named "[x]" is not a Rich style tag.
    t = Table(title=escape(title), box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for i, header in enumerate(headers):
        # The first column holds names (may fold); numbers never wrap.
        t.add_column(
            escape(header),
            justify="left" if i < num_labels else "right",
            no_wrap=i > 0,
            overflow="fold",
        )
    for r in rows:
        t.add_row(*(escape(c) for c in r))
    return t


def ranking_table(ranking: Ranking, width: int = WIDE_COLUMNS) -> Table:
    """The ranking on the run's objective (experiment/ranking.py) as a Rich table; below
    WIDE_COLUMNS the value's own interval is left out (the difference's stays: it is what a
    choice rests on; summary.md and metrics.json keep both)."""
    headers, rows = ranking_cells(ranking)
    if width < WIDE_COLUMNS:
        headers, rows = headers[:2] + headers[3:], [r[:2] + r[3:] for r in rows]
    spec = SPECS[ranking.objective]
    better = "higher" if spec.higher_is_better else "lower"
    title = f"Ranked on {spec.label} ({better} is better; objective={ranking.objective})"
    return _table(title, headers, rows, 1)


def markdown_ranking(ranking: Ranking) -> str:
    """The ranking table and its lines as GitHub markdown."""
    headers, rows = ranking_cells(ranking)
    flat = [" ".join(h.split()) for h in headers]
    lines = ["| " + " | ".join(flat) + " |", "|---|" + "---:|" * (len(flat) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + "\n".join(ranking_lines(ranking)) + "\n"


def present_extras(rows: Sequence[PolicyRow]) -> tuple[tuple[str, str, str], ...]:
    return tuple(c for c in EXTRA_COLUMNS if any(c[0] in r.extras for r in rows))


def answer_tables(rows: Sequence[PolicyRow], baseline: str, title: str, width: int) -> list[Table]:
    """The tables for a terminal `width` columns wide (split and stacked below WIDE_COLUMNS)."""
    extras = present_extras(rows)
    heads = outcome_headers(baseline, extras)
    outcome = [outcome_cells(r, extras) for r in rows]
    if width >= WIDE_COLUMNS:
        latency = [[r.policy, *latency_cells(r)] for r in rows]
        wide = [
            _table(title, heads, outcome),
            _table("Latency (ms)", ["policy", *latency_headers()], latency),
        ]
        console = Console(width=width)
        if all(Measurement.get(console, console.options, t).maximum <= width for t in wide):
            return wide
    split = 5  # policy .. evictions | policy, goodput, throughput, extras
    stacked = [
        [r.policy if i == 0 else "", LATENCY_TITLES[n], *(fmt_ms(r.serving[f"{n}_{s}_ms"])
                                                          for s in STATS)]
        for r in rows
        for i, (n, _, _) in enumerate(LATENCIES)
    ]  # fmt: skip
    return [
        _table(title, heads[:split], [c[:split] for c in outcome]),
        _table("", [heads[0], *heads[split:]], [[c[0], *c[split:]] for c in outcome]),
        _table("Latency (ms)", ["policy", "latency", "mean", "p50", "p99"], stacked, 2),
    ]


def answer_sections(
    rows: Sequence[PolicyRow], baseline: str
) -> list[tuple[str, list[str], list[list[str]]]]:
    """The wide tables as (heading, headers, formatted rows): for markdown and the HTML report."""
    extras = present_extras(rows)
    return [
        ("Outcome", outcome_headers(baseline, extras), [outcome_cells(r, extras) for r in rows]),
        (
            "Latency, ms",
            ["policy", *latency_headers()],
            [[r.policy, *latency_cells(r)] for r in rows],
        ),
    ]


def markdown_answer(rows: Sequence[PolicyRow], baseline: str) -> str:
    """The wide tables as GitHub markdown (headers on one line)."""
    lines: list[str] = []
    for i, (heading, headers, body) in enumerate(answer_sections(rows, baseline)):
        flat = [" ".join(h.split()) for h in headers]
        lines += ["", f"{heading}:", ""] if i else []
        lines += ["| " + " | ".join(flat) + " |", "|---|" + "---:|" * (len(flat) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines) + "\n\n" + NOTE.format(base=baseline) + "\n"


def bench_block(row: PolicyRow) -> str:
    """One cell as `vllm bench serve` prints its result (plus the KV-cache lines)."""
    s = row.serving

    def line(label: str, value: str) -> str:
        return f"{label:<40}{value}"

    def rule(text: str, fill: str = "-") -> str:
        return text.center(50, fill)

    out = [
        rule(" Serving Benchmark Result ", "="),
        line("Successful requests:", f"{s['completed']:.0f}"),
        line("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
        line("Total input tokens:", f"{s['input_tokens']:.0f}"),
        line("Total generated tokens:", f"{s['output_tokens']:.0f}"),
        line("Request throughput (req/s):", f"{s['request_throughput_req_s']:.2f}"),
        line("Request goodput (req/s):", f"{row.goodput_req_s:.2f}"),
        line("Output token throughput (tok/s):", f"{s['output_throughput_tok_s']:.2f}"),
    ]
    sections = {
        "ttft": ("Time to First Token", "TTFT"),
        "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
        "itl": ("Inter-token Latency", "ITL"),
        "e2e": ("End-to-end Latency", "E2EL"),
    }
    for name, (heading, short) in sections.items():
        out.append(rule(heading))
        for stat, label in zip(STATS, ("Mean", "Median", "P99"), strict=True):
            out.append(line(f"{label} {short} (ms):", f"{s[f'{name}_{stat}_ms']:.2f}"))
    out += [
        rule("KV cache"),
        line("Realized restore (s):", f"{row.restore_mean_s:.2f}"),
        line("Evictions:", f"{row.evictions:.0f}"),
        "=" * 50,
    ]
    return "\n".join(out)
