"""What a serving engineer reads off a run: latency (TTFT, TPOT, ITL, E2E) in ms with mean, median
and p99, request and output-token throughput, per cell; per policy, the mean over seeds and the
paired ratio of realized restore time to a baseline policy with a 95 % interval over seeds
(intervals.py: never below zero; none under three seeds).

These numbers come from the per-request table (`metrics.REQUEST_SCHEMA`) and are kept apart from
`metrics.json` (whose cells stay as they were); they go to the terminal table, `results.csv` and
the run report. ITL is exact for a simulated cell: the engine counts every output token after a
request's first by its gap since that request's previous token (`EngineStats.itl_gaps`: a decoding
token waits one step, a token after a preemption waits until the request runs again), and mean,
p50 and p99 are over those gaps (`numpy.percentile`'s linear rule on the expanded list). They
include the tokens of requests rejected after a preemption (their KV outgrew the pool), which
the other latencies, over completed requests, leave out. A
request table alone (no gaps given) falls back to each request's (tokens - 1) gaps at its own
mean gap (TPOT): the same mean, but percentiles that miss the long steps (a prefill chunk beside
the decodes, a preemption) that ITL's tail is about.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.experiment.intervals import nonnegative_interval

# (prefix, column of the request table, scale to ms)
LATENCIES: tuple[tuple[str, str, float], ...] = (
    ("ttft", "ttft_us", 1e-3),
    ("tpot", "tpot_us", 1e-3),
    ("itl", "tpot_us", 1e-3),
    ("e2e", "e2e_us", 1e-3),
)
STATS = ("mean", "p50", "p99")
# Policy-lab and replay metrics of metrics.json shown beside the answer when the cells have them.
EXTRA_KEYS = ("oracle_gap_mean", "offline_lp_restore_s", "prefix_hit_ratio")
SERVING_KEYS: tuple[str, ...] = (
    "completed",
    "duration_s",
    "input_tokens",
    "output_tokens",
    "request_throughput_req_s",
    "output_throughput_tok_s",
    *(f"{name}_{stat}_ms" for name, _, _ in LATENCIES for stat in STATS),
)


def _nan3() -> list[float]:
    return [math.nan] * 3


def serving_stats(
    requests: pl.DataFrame, duration_s: float, itl_gaps: dict[int, int] | None = None
) -> dict[str, float]:
    """Per-cell serving statistics (see the module docstring) over completed requests; ITL from
    `itl_gaps` (gap us -> tokens) when given."""
    done = requests.filter(pl.col("outcome") == "completed")
    decoding = done.filter(pl.col("generated") > 1)
    seconds = max(duration_s, 1e-9)
    out: dict[str, float] = {
        "completed": float(done.height),
        "duration_s": duration_s,
        "input_tokens": float(done["prompt_tokens"].sum()),
        "output_tokens": float(done["generated"].sum()),
        "request_throughput_req_s": done.height / seconds,
        "output_throughput_tok_s": float(done["generated"].sum()) / seconds,
    }
    for name, column, scale in LATENCIES:
        frame = decoding if column == "tpot_us" else done
        if name == "itl" and itl_gaps:
            values = gap_stats(itl_gaps)
        elif frame.height == 0:
            values = _nan3()
        elif name == "itl":
            gaps = (frame["generated"] - 1).to_numpy()
            per_token = np.repeat(frame[column].to_numpy(), gaps)
            values = [float(np.mean(per_token)), *np.percentile(per_token, [50, 99]).tolist()]
        else:
            col = pl.col(column).cast(pl.Float64)
            row = frame.select(
                col.mean().alias("mean"),
                col.quantile(0.5, "linear").alias("p50"),
                col.quantile(0.99, "linear").alias("p99"),
            ).row(0)
            values = [float(v) for v in row]
        for stat, value in zip(STATS, values, strict=True):
            out[f"{name}_{stat}_ms"] = value * scale
    return out


def gap_stats(gaps: dict[int, int]) -> list[float]:
    """Mean, p50 and p99 of gaps given as value -> count, equal to numpy's mean and linear
    percentile of the expanded list (without building it)."""
    values = np.array(sorted(gaps), dtype=np.float64)
    counts = np.array([gaps[int(v)] for v in values], dtype=np.int64)
    last = np.cumsum(counts) - 1  # index of each value's last copy in the sorted list
    out = [float(np.dot(values, counts) / counts.sum())]
    for q in (50, 99):
        pos = q / 100 * last[-1]
        lo = int(np.floor(pos))
        v_lo = values[np.searchsorted(last, lo)]
        v_hi = values[np.searchsorted(last, min(lo + 1, int(last[-1])))]
        out.append(float(v_lo + (pos - lo) * (v_hi - v_lo)))
    return out


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """Mean over seeds of policy / baseline on the same seed, with a 95 % percentile bootstrap
    interval (NaN under intervals.MIN_SEEDS seeds): a ratio of non-negative times is never
    below 0, and neither is its interval."""

    mean: float
    low: float
    high: float
    num_seeds: int


def paired_ratio(
    cells: Sequence[dict[str, Any]], policy: str, baseline: str, key: str
) -> PairedRatio:
    """`key` of `policy` over `key` of `baseline`, paired by seed (seeds where both ran and the
    baseline is non-zero); the interval is intervals.nonnegative_interval's."""
    base = {c["seed"]: c[key] for c in cells if c["policy"] == baseline}
    ratios = [
        c[key] / base[c["seed"]] for c in cells if c["policy"] == policy and base.get(c["seed"])
    ]
    i = nonnegative_interval(ratios)
    return PairedRatio(i.mean, i.low, i.high, i.n)


def baseline_policy(policies: Sequence[str]) -> str:
    """The policy the others are compared with: LRU when it ran, else the first one."""
    return "lru" if "lru" in policies else policies[0]


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """One policy's line of the answer: means over its seeds plus the paired ratio."""

    policy: str
    num_seeds: int
    restore_mean_s: float
    restore_std_s: float
    evictions: float
    goodput_req_s: float
    ratio: PairedRatio
    serving: dict[str, float]  # SERVING_KEYS -> mean over seeds
    extras: dict[str, float]  # EXTRA_KEYS the cells have -> mean over seeds


def policy_rows(
    cells: Sequence[dict[str, Any]], serving: Sequence[dict[str, float]], baseline: str
) -> list[PolicyRow]:
    """One row per policy in run order; `serving[i]` belongs to `cells[i]`."""
    rows = []
    for policy in dict.fromkeys(c["policy"] for c in cells):
        idx = [i for i, c in enumerate(cells) if c["policy"] == policy]
        restore = np.array([cells[i]["realized_restore_s"] for i in idx], dtype=np.float64)
        means = {
            k: float(np.mean([serving[i][k] for i in idx])) if serving else math.nan
            for k in SERVING_KEYS
        }
        rows.append(
            PolicyRow(
                policy=policy,
                num_seeds=len(idx),
                restore_mean_s=float(np.mean(restore)),
                restore_std_s=float(np.std(restore, ddof=1)) if len(idx) > 1 else 0.0,
                evictions=float(np.mean([cells[i]["evictions"] for i in idx])),
                goodput_req_s=float(np.mean([cells[i]["goodput_req_s"] for i in idx])),
                ratio=paired_ratio(cells, policy, baseline, "realized_restore_s"),
                serving=means,
                extras={
                    k: float(np.mean([cells[i][k] for i in idx]))
                    for k in EXTRA_KEYS
                    if k in cells[idx[0]]
                },
            )
        )
    return rows
