"""Per-request results and run metrics derived from the event trace alone (one source of truth).

Each function is a documented polars query over the trace (`TRACE_SCHEMA`) and the run's
`meta.json` (class names, SLOs, pool size); the metrics over the rebuilt per-request table are the
collector's own (`metrics.py`, as `Simulation.metrics` uses them), so only the table and
the event totals are derived here. `tests/unit/test_trace_derive.py` checks that the derived
metrics equal what the collector reports. Unlike `schema` and `recorder`, which components use,
this module reads traces after a run and may import above the simulation.
Queries run lazily, so they work on a trace larger than memory (`load_trace(...)` scans the parts).
From a session-sampled trace (`trace.session_every > 1`) the per-request rows are exact for the
sessions kept; counts and rates then describe that sample (scale counts by `session_every`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.inputs import InputError
from cachepilot_sim.metrics import request_metrics, restore_metrics
from cachepilot_sim.trace.recorder import META_FILE
from cachepilot_sim.trace.schema import REJECT_REASONS, TRACE_SCHEMA

Trace = pl.DataFrame | pl.LazyFrame
K = pl.col("kind")
_SOURCES = ("hit", "reload_done", "recompute")
_SOURCE_NAME = {"hit": "hit", "reload_done": "reload", "recompute": "recompute"}


RUN_FILE = "run.json"  # a run folder's owner record: run id and cells (experiment/outdir.py)


class TraceError(InputError):
    """A trace folder that cannot be read: the message names the file and what is wrong."""


def load_trace(trace_dir: Path) -> tuple[pl.LazyFrame, dict[str, Any]]:
    """Scan a trace folder's part files and read its meta.json (written last by a complete run)."""
    trace_dir = Path(trace_dir)
    meta_path = trace_dir / META_FILE
    if not trace_dir.is_dir():
        raise TraceError(f"{trace_dir}: no such trace folder")
    parts = sorted(trace_dir.glob("part-*.parquet"))
    if not meta_path.exists():
        raise TraceError(f"{meta_path}: missing; the run did not finish (incomplete trace)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TraceError(f"{meta_path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise TraceError(f"{meta_path}: not a JSON object")
    for key in ("class_names", "ttft_slo_us", "tpot_slo_us", "kv_pool_bytes"):
        if key not in meta:
            raise TraceError(f"{meta_path}: key '{key}' missing")
    if not parts:
        raise TraceError(f"{trace_dir}: meta.json but no part-*.parquet files")
    _check_manifest(meta_path, meta, parts)
    if (why := check_trace_owner(trace_dir, meta)) is not None:
        raise TraceError(why)
    for part in parts:
        try:
            schema = pl.scan_parquet(part, glob=False).collect_schema()
        except (pl.exceptions.PolarsError, OSError) as err:
            raise TraceError(f"{part}: not a readable Parquet file (truncated?): {err}") from err
        if dict(schema) != dict(TRACE_SCHEMA):
            missing = sorted(set(TRACE_SCHEMA) - set(schema))
            raise TraceError(f"{part}: schema differs from TRACE_SCHEMA (missing {missing})")
    # glob=False: a sweep job folder named `compare_policies=[perc]` is a path, not a pattern.
    return pl.scan_parquet(parts, glob=False), meta


def check_trace_owner(trace_dir: Path, meta: dict[str, Any]) -> str | None:
    """Why the trace folder does not belong to the run of its run folder, or None when it does
    (or when the run folder has no run.json: one trace folder on its own, or an older run)."""
    run_file = trace_dir.parent.parent / RUN_FILE
    if trace_dir.parent.name != "trace" or not run_file.is_file():
        return None
    try:
        record = json.loads(run_file.read_text())
        cells = record["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{run_file}: unreadable ({err})"
    if trace_dir.name not in cells:
        return f"{trace_dir}: not a cell of the run in {run_file} (left by an earlier run?)"
    return None


def _check_manifest(meta_path: Path, meta: dict[str, Any], parts: list[Path]) -> None:
    """Every part on disk is one meta.json lists (written by the same run), and none is missing.
    Traces written before the manifest existed have no `parts` key and are read as they are."""
    listed = meta.get("parts")
    if listed is None:
        return
    on_disk = {p.name for p in parts}
    extra, missing = sorted(on_disk - set(listed)), sorted(set(listed) - on_disk)
    if extra:
        raise TraceError(
            f"{meta_path}: {extra[0]} is not among this run's parts (left by another run?); "
            f"{len(extra)} such part(s); rerun into an empty folder"
        )
    if missing:
        raise TraceError(f"{meta_path}: part {missing[0]} listed but missing")


def slo_frame(meta: dict[str, Any]) -> pl.DataFrame:
    """One row per workload class: its index, name and SLOs in microseconds."""
    names = meta["class_names"]
    return pl.DataFrame(
        {
            "class_index": list(range(len(names))),
            "workload_class": names,
            "ttft_slo_us": meta["ttft_slo_us"],
            "tpot_slo_us": meta["tpot_slo_us"],
        },
        schema={
            "class_index": pl.Int32,
            "workload_class": pl.Utf8,
            "ttft_slo_us": pl.Int64,
            "tpot_slo_us": pl.Int64,
        },
    )


def _first(expr: pl.Expr, when: pl.Expr, default: int | None = None) -> pl.Expr:
    out = expr.filter(when).first()
    return out if default is None else out.fill_null(default)


def request_results(trace: Trace, meta: dict[str, Any]) -> pl.DataFrame:
    """One row per request that arrived, in request order (the columns of `metrics.REQUEST_SCHEMA`
    that the trace holds; `generated` is null for rejected requests).

    arrival = the `arrive` row; admitted = first `admit`; first token = `first_token`; finish =
    `finish` or `reject`; kv_source = the last of hit / reload_done / recompute (new when none);
    reload_us = sum of reload_done durations; recompute_us = recompute cost; preemptions = count.
    """
    lf = trace.lazy().sort("seq")
    t, v = pl.col("t_us"), pl.col("value")
    arrive = lf.filter(K == "arrive").select(
        "request", "session", "model", "class_index", pl.col("t_us").alias("arrival_us")
    )
    per = (
        lf.filter(pl.col("request") >= 0)
        .group_by("request")
        .agg(
            _first(t, K == "admit", -1).alias("admitted_us"),
            _first(t, K == "first_token", -1).alias("first_token_us"),
            _first(t, K.is_in(["finish", "reject"]), -1).alias("finish_us"),
            _first(v, K == "finish").alias("generated"),
            _first(v, K == "reject").alias("reject_code"),
            v.filter(K == "reload_done").sum().alias("reload_us"),
            pl.col("cost_us").filter(K == "recompute").sum().alias("recompute_us"),
            (K == "preempt").sum().cast(pl.Int64).alias("preemptions"),
            (K == "swap_out").sum().cast(pl.Int64).alias("cpu_swaps"),
            K.filter(K.is_in(_SOURCES)).last().cast(pl.Utf8).alias("source_kind"),
            _first(v, K == "session_start", 0).alias("session_wait_us"),
        )
    )
    done = pl.col("outcome") == "completed"
    since_arrival = pl.col("first_token_us") - pl.col("arrival_us")
    ttft = pl.when(pl.col("first_token_us") >= 0).then(since_arrival).otherwise(-1)
    tpot = (
        pl.when(done & (pl.col("generated") > 1))
        .then((pl.col("finish_us") - pl.col("first_token_us")) / (pl.col("generated") - 1))
        .otherwise(0.0)
    )
    out = (
        arrive.join(per, on="request", how="left")
        .join(slo_frame(meta).lazy(), on="class_index", how="left")
        .with_columns(
            pl.col("session")
            .cum_count()
            .over("session", order_by="request")
            .sub(1)
            .cast(pl.Int64)
            .alias("turn"),
            pl.when(pl.col("generated").is_not_null())
            .then(pl.lit("completed"))
            .otherwise(pl.lit("rejected"))
            .alias("outcome"),
            pl.col("reject_code")
            .replace_strict(list(range(len(REJECT_REASONS))), list(REJECT_REASONS), default="")
            .fill_null("")
            .alias("reject_reason"),
            pl.col("source_kind")
            .replace_strict(_SOURCE_NAME, default="new")
            .fill_null("new")
            .alias("kv_source"),
        )
        .with_columns(
            ttft.alias("ttft_us"),
            tpot.alias("tpot_us"),
            pl.when(done)
            .then(pl.col("finish_us") - pl.col("arrival_us"))
            .otherwise(-1)
            .alias("e2e_us"),
        )
        .with_columns(
            (
                done
                & (pl.col("ttft_us") <= pl.col("ttft_slo_us"))
                & (pl.col("tpot_us") <= pl.col("tpot_slo_us"))
            ).alias("sla_met")
        )
        .sort("request")
    )
    return out.select(
        "request",
        "session",
        "turn",
        "workload_class",
        "model",
        "arrival_us",
        "admitted_us",
        "first_token_us",
        "finish_us",
        "generated",
        "outcome",
        "reject_reason",
        "kv_source",
        "reload_us",
        "recompute_us",
        "preemptions",
        "cpu_swaps",
        "ttft_us",
        "tpot_us",
        "e2e_us",
        "sla_met",
        "session_wait_us",
    ).collect()


def _count(when: pl.Expr) -> pl.Expr:
    return when.sum().cast(pl.Int64)


def event_totals(trace: Trace) -> dict[str, int | float]:
    """Run-level sums over event rows: the end (`run_end` row) and the served span (last answer),
    realized and expected costs,
    evictions (a CPU-tier `evict_drop` is the CPU store dropping KV, counted as `cpu_drops`), cache
    outcomes, PCIe bytes, and the engine integrals of the `iteration` rows."""
    t, v, b, c = pl.col("t_us"), pl.col("value"), pl.col("bytes"), pl.col("cost_us")
    gpu_drop = (K == "evict_drop") & (pl.col("tier") != "cpu")
    evict = (K == "evict_offload") | gpu_drop
    it = K == "iteration"
    return (
        trace.lazy()
        .select(
            t.filter(K == "run_end").max().alias("duration_us"),
            # The served span ends with the last answer (or rejection), as in sim.metrics().
            t.filter((K == "finish") | (K == "reject")).max().alias("span_us"),
            v.filter(K == "reload_done").sum().alias("realized_reload_us"),
            c.filter(K == "recompute").sum().alias("realized_recompute_us"),
            c.filter(K == "preempt").sum().alias("preempt_recompute_us"),
            c.filter(evict).sum().alias("expected_evict_cost_us"),
            _count(K == "evict_offload").alias("evictions_offload"),
            _count(gpu_drop).alias("evictions_drop"),
            b.filter(K == "evict_offload").sum().alias("evicted_bytes_offload"),
            b.filter(gpu_drop).sum().alias("evicted_bytes_drop"),
            _count((K == "evict_drop") & (pl.col("tier") == "cpu")).alias("cpu_drops"),
            _count(K == "hit").alias("hits"),
            _count(K == "reload_done").alias("reloads"),
            _count(K == "recompute").alias("recomputes"),
            _count(K == "preempt").alias("preemptions"),
            _count(K == "swap_out").alias("cpu_swaps"),
            _count(K == "session_start").alias("sessions"),
            b.filter(K.is_in(["offload_done", "swap_out"])).sum().alias("pcie_d2h_bytes"),
            b.filter(K.is_in(["reload_done", "swap_in"])).sum().alias("pcie_h2d_bytes"),
            pl.len().cast(pl.Int64).alias("events"),
            v.filter(it).sum().alias("busy_us"),
            (b * v).filter(it).sum().alias("kv_byte_us"),
            b.filter(it).max().fill_null(0).alias("kv_peak_bytes"),
        )
        .collect()
        .row(0, named=True)
    )


def run_metrics(trace: Trace, meta: dict[str, Any]) -> dict[str, Any]:
    """The collector's run metrics (`Simulation.metrics`) computed from the trace alone.

    Engine metrics (GPU busy fraction, KV pool utilisation) come from `iteration` rows and are
    included only when every iteration was traced (`trace.iteration_every == 1`).
    """
    totals = event_totals(trace)
    duration = totals["duration_us"]
    if duration is None:
        raise TraceError("trace has no run_end row: the run did not finish")
    out: dict[str, Any] = {"policy": meta.get("policy"), "seed": meta.get("seed")}
    span_us = max(int(totals["span_us"] or 0), 1)
    out |= request_metrics(request_results(trace, meta), span_us)
    out |= restore_metrics(totals)
    out |= {
        "pcie_d2h_gb": totals["pcie_d2h_bytes"] / 1e9,
        "pcie_h2d_gb": totals["pcie_h2d_bytes"] / 1e9,
    }
    for key in (
        "evictions_offload",
        "evictions_drop",
        "evicted_bytes_offload",
        "evicted_bytes_drop",
        "cpu_drops",
        "hits",
        "reloads",
        "recomputes",
        "preemptions",
        "cpu_swaps",
        "sessions",
        "events",
    ):
        out[key] = totals[key]
    out["soft_resets"] = totals["preemptions"] - totals["cpu_swaps"]
    if meta.get("iteration_every") == 1:
        span, pool = span_us, meta["kv_pool_bytes"]
        out |= {
            "gpu_busy_frac": totals["busy_us"] / span,
            "vram_kv_util_mean": totals["kv_byte_us"] / span / pool,
            "vram_kv_util_peak": totals["kv_peak_bytes"] / pool,
        }
    return out
