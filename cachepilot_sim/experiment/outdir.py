"""A run owns its output folder: it removes what an earlier run wrote there before writing its own,
records which cells belong to it (`run.json`), and writes strict JSON.

Without this, a second run into the same folder (or a sweep job rerun after its config changed) left
the first run's trace parts, request files and trace folders beside the new ones, and `plot` and
`derive` mixed them without a word. Only the runner's own outputs are removed (the names below);
anything else in the folder is left alone.

A rerun replaces the earlier results atomically with respect to failure: it writes into
`<dir>/.staging/` (claim) and only once it has completed moves the earlier outputs to
`<dir>/.trash/`, marks the trash complete, moves the staged files in and deletes both (commit). A
run that fails or is stopped deletes its staging folder (discard), so the folder holds the earlier
run's files byte for byte. A run killed mid-swap is finished by the next run into the folder
(heal): a complete trash means the new files were all staged, so the swap is rolled forward; an
incomplete one is moved back (rolled back). Hydra's `.hydra/` is written before the run starts:
the Preflight callback moves the earlier one to `.hydra-previous/` (backup_hydra), a failed run
puts it back (restore_hydra), the commit deletes it. The runner defers SIGINT, SIGTERM and SIGHUP
while it commits, so a stop lands before the swap (results kept) or after it (results replaced).
Readers skip these folders (`hidden`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from cachepilot_sim.config.cluster import cluster_id_suffix
from cachepilot_sim.outputs import (  # noqa: F401 - the run's folder rules, shared with the tools
    HYDRA_BACKUP,
    STAGING,
    SWAP_DONE,
    TRASH,
    OutputDirError,
    claim_folder,
    discard,
    drop_hydra_backup,
    finish_swap,
    finite_or_none,
    heal,
    hidden,
    signals_deferred,
    start_swap,
    write_text,
)
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


def run_id(cfg: object) -> str:
    """Digest of the run's typed config: equal configs give equal ids (reruns stay
    byte-identical); a changed config gives a new id."""
    text = repr(cfg)
    cluster, router = getattr(cfg, "cluster", None), getattr(cfg, "router", None)
    if cluster is not None and router is not None:  # out of repr (config/run.py says why)
        text += cluster_id_suffix(cluster, router)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owned_files(out_dir: Path) -> list[Path]:
    """The runner's own files in `out_dir` (outputs and temporary leftovers), nothing else."""
    found = [out_dir / n for n in RUN_OUTPUTS if (out_dir / n).is_file()]
    found += [*out_dir.glob("*.tmp"), *(out_dir / "requests").glob("*.parquet*")]
    trace = out_dir / "trace"
    for cell_dir in sorted(trace.iterdir()) if trace.is_dir() else []:
        if cell_dir.is_dir():
            found += [p for p in (cell_dir / META_FILE,) if p.is_file()]
            found += [*cell_dir.glob("part-*.parquet"), *cell_dir.glob("*.tmp")]
    return found


def commit(out_dir: Path, owned: list[Path] | None = None) -> None:
    """A complete run: move the earlier outputs (`owned`, by default the runner's own files) to
    the trash, mark it complete, move the staged files in, delete both folders and the earlier
    `.hydra/` (backup_hydra)."""
    start_swap(out_dir, owned_files(out_dir) if owned is None else owned)
    trace = out_dir / "trace"
    for cell_dir in sorted(trace.iterdir()) if trace.is_dir() else []:
        if cell_dir.is_dir() and not any(cell_dir.iterdir()):
            cell_dir.rmdir()
    finish_swap(out_dir)


def claim(out_dir: Path, rid: str, cells: list[str]) -> Path:
    """Heal what a killed run left in `out_dir`, make an empty staging folder there holding
    run.json (this run's id and cells) and return it: the run writes its outputs there.
    Raises OutputDirError when the folder cannot be created or written."""
    stage = claim_folder(out_dir)
    try:
        write_json(stage / RUN_FILE, {"run_id": rid, "cells": cells})
    except OSError as err:
        raise OutputDirError(f"{out_dir}: cannot write results there ({err.strerror})") from err
    return stage


def backup_hydra(out_dir: Path) -> None:
    """Before Hydra writes this run's `.hydra/`: heal the folder, then keep the earlier `.hydra/`
    as `.hydra-previous/` (empty when the earlier results had none) and mark the folder as in use
    by a run (an empty staging folder), so that a run killed before its commit is undone."""
    if not out_dir.is_dir():
        return
    backup, hydra = out_dir / HYDRA_BACKUP, out_dir / ".hydra"
    if backup.exists():  # left by a killed run: whose `.hydra/` is current?
        if heal(out_dir):
            shutil.rmtree(backup, ignore_errors=True)
        else:
            restore_hydra(out_dir)
    else:
        heal(out_dir)
    if hydra.is_dir():
        os.replace(hydra, backup)
    elif (out_dir / RUN_FILE).exists():
        backup.mkdir()
    (out_dir / STAGING).mkdir(exist_ok=True)


def restore_hydra(out_dir: Path) -> None:
    """A failed run: put the earlier `.hydra/` back (none, if the earlier results had none)."""
    backup, hydra = out_dir / HYDRA_BACKUP, out_dir / ".hydra"
    if not backup.is_dir():
        return
    shutil.rmtree(hydra, ignore_errors=True)
    if any(backup.iterdir()):
        os.replace(backup, hydra)
    else:
        backup.rmdir()


def write_json(path: Path, payload: Any) -> None:
    """Strict JSON, written to a temporary name and renamed.

    JSON has no NaN: Python's default writes a bare `NaN` that jq, browsers and strict parsers
    refuse, and readers then guessed (collect turned such columns into strings). A metric without
    a value (vs LRU when no LRU ran, a ratio over 0) is written as null.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite_or_none(payload), indent=1, allow_nan=False))
    os.replace(tmp, path)
