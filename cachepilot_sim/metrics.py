"""Per-request results and run metrics: realized costs (time actually paid), latency and goodput.

TTFT runs from the moment a turn was sent to its first token (a new session's wait for a front-end
slot is reported apart, as session_wait); TPOT is (finish - first token) / (tokens - 1); a request
meets its SLA when both are within its class's targets. Goodput counts only completed requests that
met their SLA. The one implementation: `Simulation.metrics` applies it to the requests it
collected, `trace/derive.py` to the per-request table it rebuilds from a trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.components.request import KvSource, Outcome, Request

REQUEST_SCHEMA = pl.Schema(
    {
        "request": pl.Int64,
        "session": pl.Int64,
        "turn": pl.Int64,
        "workload_class": pl.Utf8,
        "model": pl.Int32,
        "priority": pl.Int64,
        "arrival_us": pl.Int64,
        "admitted_us": pl.Int64,
        "first_token_us": pl.Int64,
        "finish_us": pl.Int64,
        "context_tokens": pl.Int64,
        "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "generated": pl.Int64,
        "outcome": pl.Utf8,
        "reject_reason": pl.Utf8,
        "kv_source": pl.Utf8,
        "reload_us": pl.Int64,
        "recompute_us": pl.Float64,
        "preemptions": pl.Int64,
        "ttft_us": pl.Int64,
        "tpot_us": pl.Float64,
        "e2e_us": pl.Int64,
        "sla_met": pl.Boolean,
        "session_wait_us": pl.Int64,
        "cpu_swaps": pl.Int64,  # of `preemptions`: KV kept in the engine's CPU swap space
    }
)


def request_row(
    r: Request, class_names: Sequence[str], ttft_slo_us: Sequence[int]
) -> tuple[Any, ...]:
    """Request `r`'s row of the per-request table (`REQUEST_SCHEMA`'s columns, in order)."""
    done = r.outcome == Outcome.COMPLETED
    ttft = r.first_token_us - r.arrival_us if r.first_token_us >= 0 else -1
    tpot = (r.finish_us - r.first_token_us) / (r.generated - 1) if done and r.generated > 1 else 0.0
    return (
        r.req_id,
        r.session_id,
        r.turn,
        class_names[r.class_index],
        r.model_index,
        r.priority,
        r.arrival_us,
        r.admitted_us,
        r.first_token_us,
        r.finish_us,
        r.context_tokens,
        r.prompt_tokens,
        r.output_tokens,
        r.generated,
        r.outcome.name.lower(),
        r.reject_reason,
        KvSource(r.kv_source).name.lower(),
        r.reload_us_paid,
        r.recompute_us_paid,
        r.num_preemptions,
        ttft,
        tpot,
        r.finish_us - r.arrival_us if done else -1,
        done and ttft <= ttft_slo_us[r.class_index] and tpot <= r.tpot_slo_us,
        r.session_wait_us,
        r.num_cpu_swaps,
    )


def request_frame(
    requests: Sequence[Request], class_names: Sequence[str], ttft_slo_us: Sequence[int]
) -> pl.DataFrame:
    """One row per request, in the order given (a run's: issue order). A run streams its rows
    through `request_log.RequestLog` instead."""
    rows = [request_row(r, class_names, ttft_slo_us) for r in requests]
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in REQUEST_SCHEMA]
    return pl.DataFrame(
        dict(zip(REQUEST_SCHEMA.names(), columns, strict=True)), schema=REQUEST_SCHEMA
    )


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def latency_metrics(frame: pl.DataFrame) -> dict[str, float]:
    """TTFT (s), TPOT (ms) and end-to-end (s) percentiles over completed requests."""
    done = frame.filter(pl.col("outcome") == "completed")
    ttft = done["ttft_us"].to_numpy() / 1e6
    tpot = done.filter(pl.col("generated") > 1)["tpot_us"].to_numpy() / 1e3
    e2e = done["e2e_us"].to_numpy() / 1e6
    wait = frame.filter(pl.col("turn") == 0)["session_wait_us"].to_numpy() / 1e6
    return {
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p95_s": _pct(ttft, 95),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50),
        "tpot_p95_ms": _pct(tpot, 95),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "session_wait_p50_s": _pct(wait, 50),
        "session_wait_p95_s": _pct(wait, 95),
    }


def outcome_metrics(frame: pl.DataFrame, duration_us: int) -> dict[str, float | int]:
    """Counts, throughput and goodput over a served span of `duration_us` (at least 1 us)."""
    done = frame.filter(pl.col("outcome") == "completed")
    seconds = max(duration_us, 1) / 1e6
    met = done.filter(pl.col("sla_met"))
    sources = done["kv_source"].value_counts()
    by_source = dict(zip(sources["kv_source"].to_list(), sources["count"].to_list(), strict=False))
    return {
        "requests": frame.height,
        "completed": done.height,
        "rejected": frame.height - done.height,
        "duration_s": seconds,
        "throughput_tok_s": float(done["generated"].sum()) / seconds,
        "goodput_req_s": met.height / seconds,
        "goodput_tok_s": float(met["generated"].sum()) / seconds,
        "sla_attainment": met.height / max(frame.height, 1),
        "turns_hit": int(by_source.get("hit", 0)),
        "turns_reload": int(by_source.get("reload", 0)),
        "turns_recompute": int(by_source.get("recompute", 0)),
    }


def request_metrics(frame: pl.DataFrame, duration_us: int) -> dict[str, float | int]:
    """`outcome_metrics` then `latency_metrics`: every run metric the per-request table gives."""
    return outcome_metrics(frame, duration_us) | latency_metrics(frame)


def restore_metrics(totals: Mapping[str, float]) -> dict[str, float | int]:
    """Realized restore, eviction and expected-cost metrics from cache totals.

    `totals` holds `realized_reload_us`, `realized_recompute_us`, `preempt_recompute_us`,
    `expected_evict_cost_us`, `evictions_offload`, `evictions_drop`, `evicted_bytes_offload` and
    `evicted_bytes_drop`: the KV manager's counters (`KvStats`) or the same sums over a trace
    (`trace/derive.py`). One definition for both.
    """
    reload_us, recompute_us = totals["realized_reload_us"], totals["realized_recompute_us"]
    evicted = totals["evicted_bytes_offload"] + totals["evicted_bytes_drop"]
    return {
        "realized_restore_s": (reload_us + recompute_us) / 1e6,
        "realized_reload_s": reload_us / 1e6,
        "realized_recompute_s": recompute_us / 1e6,
        "preempt_recompute_s": totals["preempt_recompute_us"] / 1e6,
        "expected_evict_cost_s": totals["expected_evict_cost_us"] / 1e6,
        "evictions": int(totals["evictions_offload"] + totals["evictions_drop"]),
        "evicted_gb": evicted / 1e9,
    }
