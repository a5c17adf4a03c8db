"""A run owns its output folder: it removes what an earlier run wrote there before writing its own,
records which cells belong to it (`run.json`), and writes strict JSON.

Without this, a second run into the same folder (or a sweep job rerun after its config changed) left
the first run's trace parts, request files and trace folders beside the new ones, and `plot` and
`derive` mixed them without a word. Only the runner's own outputs are removed (the names below);
anything else in the folder is left alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from cachepilot_sim.config.cluster import cluster_id_suffix
from cachepilot_sim.trace.derive import RUN_FILE
from cachepilot_sim.trace.recorder import META_FILE

# Written by the runner at the top of its folder; run.json last so that it marks a claimed folder.
RUN_OUTPUTS = (
    "metrics.json",
    "summary.md",
    "metrics.prom",
    "results.csv",
    "run_meta.json",
    "headline.png",
    "report.md",
    "report.html",
    RUN_FILE,
)


class OutputDirError(ValueError):
    """An output folder that cannot be used; the message names it."""


def run_id(cfg: object) -> str:
    """Digest of the run's typed config: equal configs give equal ids (reruns stay
    byte-identical); a changed config gives a new id."""
    text = repr(cfg)
    cluster, router = getattr(cfg, "cluster", None), getattr(cfg, "router", None)
    if cluster is not None and router is not None:  # out of repr (config/run.py says why)
        text += cluster_id_suffix(cluster, router)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def claim(out_dir: Path, rid: str, cells: list[str]) -> None:
    """Remove an earlier run's outputs from `out_dir`, then write run.json naming this run's
    cells. Raises OutputDirError when the folder cannot be created or written."""
    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputDirError(f"{out_dir}: output path exists and is not a folder")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in RUN_OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        for stale in (*out_dir.glob("*.tmp"), *(out_dir / "requests").glob("*.parquet*")):
            stale.unlink()
        trace = out_dir / "trace"
        for cell_dir in sorted(trace.iterdir()) if trace.is_dir() else []:
            if not cell_dir.is_dir():
                continue
            (cell_dir / META_FILE).unlink(missing_ok=True)
            for stale in (*cell_dir.glob("part-*.parquet"), *cell_dir.glob("*.tmp")):
                stale.unlink()
            if not any(cell_dir.iterdir()):
                cell_dir.rmdir()
        write_json(out_dir / RUN_FILE, {"run_id": rid, "cells": cells})
    except OSError as err:
        raise OutputDirError(f"{out_dir}: cannot write results there ({err.strerror})") from err


def finite_or_none(value: Any) -> Any:
    """The value with every NaN or infinity replaced by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def write_json(path: Path, payload: Any) -> None:
    """Strict JSON, written to a temporary name and renamed.

    JSON has no NaN: Python's default writes a bare `NaN` that jq, browsers and strict parsers
    refuse, and readers then guessed (collect turned such columns into strings). A metric without
    a value (vs LRU when no LRU ran, a ratio over 0) is written as null.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite_or_none(payload), indent=1, allow_nan=False))
    os.replace(tmp, path)
