"""The terminal answer fits 80, 120 and 200 columns with every column and every number intact;
the paired ratio's interval stays
inside the seeds' range; the single-cell block reads like vllm bench."""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from cachepilot_sim.experiment.answer import (
    answer_tables,
    bench_block,
    latency_cells,
    markdown_answer,
    outcome_cells,
    outcome_headers,
    present_extras,
)
from cachepilot_sim.experiment.serving import (
    SERVING_KEYS,
    baseline_policy,
    paired_ratio,
    policy_rows,
    serving_stats,
)

POLICIES = ("perc", "lru", "perc_clairvoyant")


def make_cells(num_seeds: int = 3) -> tuple[list[dict], list[dict[str, float]]]:
    """Cells with wide-ranging values (E2E in the tens of seconds, thousands of evictions)."""
    cells, serving = [], []
    for p, policy in enumerate(POLICIES):
        for seed in range(num_seeds):
            cells.append(
                {"policy": policy, "seed": seed, "realized_restore_s": 28.3 + p + 0.7 * seed,
                 "evictions": 12_345 + seed, "goodput_req_s": 1.38, "prefix_hit_ratio": 0.18}
            )  # fmt: skip
            s = {k: 1234.5 + 1000 * p + seed for k in SERVING_KEYS}
            s |= {"ttft_p99_ms": 12_345.0, "tpot_p50_ms": 4.28, "e2e_p99_ms": 43_640.0}
            serving.append(s)
    return cells, serving


@pytest.mark.parametrize("width", [80, 120, 200])
def test_tables_fit_the_terminal_with_every_column_and_number_whole(width: int) -> None:
    cells, serving = make_cells()
    rows = policy_rows(cells, serving, "lru")
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for table in answer_tables(rows, "lru", "mixed: 1000 requests, seeds 0..2", width):
        console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    tokens = set(re.split(r"\s{2,}|\n", text)) | set(text.split())
    extras = present_extras(rows)
    for row in rows:
        for value in [*outcome_cells(row, extras)[1:], *latency_cells(row)]:
            assert value in text, f"{value!r} missing or wrapped at {width} columns"
        assert row.policy in tokens
    for header in outcome_headers("lru", extras)[1:]:
        first_word = header.split()[0]
        assert first_word in text, f"column {header!r} missing at {width} columns"
    for name in ("TTFT", "TPOT", "ITL", "E2E"):
        assert name in text
    assert "…" not in text  # nothing truncated


def test_paired_ratio_is_the_bootstrap_interval_of_per_seed_ratios() -> None:
    cells, _ = make_cells(num_seeds=4)
    ratio = paired_ratio(cells, "perc", "lru", "realized_restore_s")
    per_seed = np.array(
        [c["realized_restore_s"] for c in cells if c["policy"] == "perc"]
    ) / np.array([c["realized_restore_s"] for c in cells if c["policy"] == "lru"])
    assert ratio.mean == pytest.approx(per_seed.mean())
    # Inside the seeds' range, so never below 0, and it holds the mean.
    assert per_seed.min() <= ratio.low <= ratio.mean <= ratio.high <= per_seed.max()
    two = paired_ratio(cells[:2] + cells[4:6], "perc", "lru", "realized_restore_s")
    assert two.num_seeds == 2 and math.isnan(two.low)  # n < 3: no interval
    assert baseline_policy(["perc", "priority"]) == "perc"


def test_too_few_seeds_is_said_in_the_ratio_column() -> None:
    cells, serving = make_cells(num_seeds=2)
    rows = policy_rows(cells, serving, "lru")
    assert outcome_cells(rows[0], ())[3] == "n=2<3"


def test_serving_stats_from_a_request_table() -> None:
    frame = pl.DataFrame(
        {
            "outcome": ["completed", "completed", "rejected"],
            "ttft_us": [10_000, 30_000, -1],
            "tpot_us": [2_000.0, 4_000.0, 0.0],
            "e2e_us": [100_000, 300_000, -1],
            "generated": [2, 4, 0],
            "prompt_tokens": [5, 7, 9],
        }
    )
    s = serving_stats(frame, duration_s=2.0)
    assert s["completed"] == 2 and s["request_throughput_req_s"] == 1.0
    assert s["output_throughput_tok_s"] == 3.0 and s["input_tokens"] == 12
    assert s["ttft_mean_ms"] == 20.0 and s["ttft_p50_ms"] == 20.0
    assert s["tpot_mean_ms"] == 3.0
    assert s["itl_mean_ms"] == pytest.approx((2 + 3 * 4) / 4)  # 1 gap at 2 ms, 3 gaps at 4 ms
    assert s["e2e_p99_ms"] == pytest.approx(100 + 0.99 * 200)


def test_single_cell_block_reads_like_vllm_bench_serve() -> None:
    cells, serving = make_cells(num_seeds=1)
    row = policy_rows(cells[:1], serving[:1], "perc")[0]
    block = bench_block(row)
    for label in (
        "Successful requests:",
        "Request throughput (req/s):",
        "Mean TTFT (ms):",
        "Median TPOT (ms):",
        "P99 ITL (ms):",
        "P99 E2EL (ms):",
        "Realized restore (s):",
    ):
        assert label in block
    assert max(len(line) for line in block.splitlines()) <= 80


def test_markdown_has_one_line_headers_and_every_policy() -> None:
    cells, serving = make_cells()
    md = markdown_answer(policy_rows(cells, serving, "lru"), "lru")
    assert "| policy | restore s (KV reload + recompute) | vs lru (ratio) |" in md
    assert all(f"| {p} |" in md for p in POLICIES) and "(seed metric)" not in md


def test_a_title_in_brackets_is_printed_not_read_as_markup() -> None:
    cells, serving = make_cells()
    rows = policy_rows(cells, serving, "lru")
    title = (
        "mixed: 1000 requests, 80 GB VRAM [h100_sxm: derived, not measured]; mean ± σ [min, max]"
    )
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for table in answer_tables(rows, "lru", title, 200):
        console.print(table)
    text = console.export_text()
    assert "[h100_sxm: derived, not measured]" in text and "[min, max]" in text
