"""The micro-run steps a step-cost fit reads (tools/fit_engine.py, tools/fit_physical.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

STEP_COLUMNS = (
    "gpu_us",
    "q_tokens",
    "kv_read_tokens",
    "max_seqlen_k",
    "prefill_tokens",
    "num_requests",
    "graph_captures",
)


def load_micro_steps(*paths: Path) -> pl.DataFrame:
    """The micro-run steps usable for a fit, from one or more steps files stacked: every column
    present, no graph capture in the step."""
    frames = []
    for path in paths:
        steps = pl.read_parquet(path)
        missing = [c for c in STEP_COLUMNS if c not in steps.columns]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}")
        frames.append(steps.filter(pl.col("graph_captures") == 0, pl.col("gpu_us") > 0))
    if len(frames) == 1:
        return frames[0]
    common = [c for c in frames[0].columns if all(c in f.columns for f in frames[1:])]
    return pl.concat([f.select(common) for f in frames], how="vertical_relaxed")
