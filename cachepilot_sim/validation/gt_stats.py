"""The metrics of one ground-truth run (validation/ground_truth.py loads and checks it): per
request latencies, and the means and percentiles `validate` compares with a replay's."""

from __future__ import annotations

from typing import Any

import polars as pl

from cachepilot_sim.validation.ground_truth import GroundTruth

PERCENTILES = (50, 90, 99)


def request_latencies(gt: GroundTruth) -> pl.DataFrame:
    """Per finished request, in microseconds: ttft, e2e, tpot ((end - first) / (tokens - 1),
    null for one-token outputs) and, when token times exist, the inter-token gaps (itl_us)."""
    df = gt.finished.with_columns(
        ttft_us=pl.col("first_token_us") - pl.col("send_us"),
        e2e_us=pl.col("end_us") - pl.col("send_us"),
        tpot_us=pl.when(pl.col("output_tokens") > 1)
        .then((pl.col("end_us") - pl.col("first_token_us")) / (pl.col("output_tokens") - 1))
        .otherwise(None),
    )
    if "token_us" in df.columns:
        df = df.with_columns(itl_us=pl.col("token_us").list.diff().list.drop_nulls())
    return df


def _stats(values: pl.Series, name: str, scale: float) -> dict[str, float | None]:
    values = values.drop_nulls().cast(pl.Float64) / scale
    out: dict[str, float | None] = {f"{name}_mean": None}
    out.update({f"{name}_p{p}": None for p in PERCENTILES})
    if values.len():
        out[f"{name}_mean"] = float(values.mean())  # type: ignore[arg-type]
        for p in PERCENTILES:
            out[f"{name}_p{p}"] = float(values.quantile(p / 100, "linear"))  # type: ignore[arg-type]
    return out


def summarize(gt: GroundTruth) -> dict[str, Any]:
    """Workload metrics: request counts, TTFT/TPOT/ITL/E2E mean and p50/p90/p99 in milliseconds
    (linear-interpolated percentiles over finished requests; ITL over all token gaps),
    output-token throughput over the span from the first send to the last token, preemptions."""
    lat = request_latencies(gt)
    out: dict[str, Any] = {
        "workload": gt.workload,
        "engine": gt.engine.get("engine"),
        "requests": gt.requests.height,
        "finished": lat.height,
        "failed": gt.requests.filter(pl.col("status") == "failed").height,
        "missing": gt.requests.filter(pl.col("status") == "missing").height,
    }
    for col, name in (("ttft_us", "ttft_ms"), ("tpot_us", "tpot_ms"), ("e2e_us", "e2e_ms")):
        out.update(_stats(lat[col], name, 1e3))
    if "itl_us" in lat.columns:
        itl = lat["itl_us"].explode()
    else:
        itl = gt.itl_us if gt.itl_us is not None else pl.Series([], dtype=pl.Int64)
    out.update(_stats(itl, "itl_ms", 1e3))
    span_us = int(lat["end_us"].max()) - int(lat["send_us"].min())  # type: ignore[arg-type]
    out["output_tokens"] = int(lat["output_tokens"].sum())
    out["throughput_tok_s"] = out["output_tokens"] / (span_us / 1e6) if span_us > 0 else None
    out["request_rate_s"] = lat.height / (span_us / 1e6) if span_us > 0 else None
    for col in ("num_soft_resets", "num_cpu_swaps"):
        out[col] = int(gt.requests[col].sum()) if col in gt.requests.columns else None
    if gt.steps is not None:
        out["steps"] = gt.steps.height
        wall = (gt.steps["end_us"] - gt.steps["start_us"]).cast(pl.Float64) / 1e3
        out["step_ms_mean"] = float(wall.mean()) if wall.len() else None  # type: ignore[arg-type]
    return out
