"""The micro-run steps a step-cost fit reads (tools/fit_engine.py, tools/fit_physical.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from cachepilot_sim.inputs import InputError, refuse_special_file

STEP_COLUMNS = (
    "gpu_us",
    "q_tokens",
    "kv_read_tokens",
    "max_seqlen_k",
    "prefill_tokens",
    "num_requests",
    "graph_captures",
)


def read_steps(path: Path) -> pl.DataFrame:
    """One steps file, checked: readable Parquet, every STEP_COLUMNS column numeric, no null,
    NaN or infinity, no negative value; an InputError names the file and the column."""
    refuse_special_file(path, "steps file")
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        steps = pl.read_parquet(path)
    except Exception as err:  # polars raises several types for corrupt or non-Parquet files
        raise InputError(f"{path}: cannot read as Parquet ({type(err).__name__})") from None
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}")
    for col in STEP_COLUMNS:
        dtype = steps.schema[col]
        if not dtype.is_numeric():
            raise InputError(f"{path}: column '{col}' has type {dtype}, expected numbers")
        values = steps[col].cast(pl.Float64)
        bad = values.is_null() | ~values.is_finite() | (values < 0)
        if bad.any():
            row = int(bad.arg_max() or 0)
            raise InputError(
                f"{path}: column '{col}' is null, NaN, infinite or negative in {int(bad.sum())} "
                f"row(s) (first: row {row}, {steps[col][row]!r})"
            )
    return steps


def load_micro_steps(*paths: Path) -> pl.DataFrame:
    """The micro-run steps usable for a fit, from one or more steps files stacked: every column
    present, no graph capture in the step."""
    frames = []
    for path in paths:
        steps = read_steps(path)
        frames.append(steps.filter(pl.col("graph_captures") == 0, pl.col("gpu_us") > 0))
    if sum(f.height for f in frames) == 0:
        raise InputError(
            f"{', '.join(map(str, paths))}: no usable step (every step captured a graph or has "
            "gpu_us 0)"
        )
    if len(frames) == 1:
        return frames[0]
    common = [c for c in frames[0].columns if all(c in f.columns for f in frames[1:])]
    return pl.concat([f.select(common) for f in frames], how="vertical_relaxed")
