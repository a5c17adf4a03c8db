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
import math
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cachepilot_sim.config.cluster import cluster_id_suffix
from cachepilot_sim.inputs import InputError
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
STAGING, TRASH, HYDRA_BACKUP = ".staging", ".trash", ".hydra-previous"
SWAP_DONE = ".complete"  # in the trash: every earlier output is in it, the staged files go in next


class OutputDirError(InputError):
    """An output folder that cannot be used; the message names it."""


def run_id(cfg: object) -> str:
    """Digest of the run's typed config: equal configs give equal ids (reruns stay
    byte-identical); a changed config gives a new id."""
    text = repr(cfg)
    cluster, router = getattr(cfg, "cluster", None), getattr(cfg, "router", None)
    if cluster is not None and router is not None:  # out of repr (config/run.py says why)
        text += cluster_id_suffix(cluster, router)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hidden(path: Path, root: Path) -> bool:
    """Whether `path` (under `root`) lies in a staging, trash or .hydra backup folder, which
    readers must not take for results."""
    return bool({STAGING, TRASH, HYDRA_BACKUP} & set(path.relative_to(root).parts))


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


def claim_folder(out_dir: Path) -> Path:
    """Heal what a killed writer left in `out_dir`, make an empty staging folder there and return
    it. Raises OutputDirError naming the folder when it is a file or cannot be created or
    written; nothing in it is touched then."""
    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputDirError(f"{out_dir}: output path exists and is not a folder")
        out_dir.mkdir(parents=True, exist_ok=True)
        heal(out_dir)
        stage = out_dir / STAGING
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
    except OSError as err:
        raise OutputDirError(f"{out_dir}: cannot write results there ({err.strerror})") from err
    return stage


def check_folder(out_dir: Path) -> None:
    """Refuse, before any work, an output folder that claim_folder would refuse (a file, a path
    under a file); a folder that does not exist yet is fine. Writes nothing."""
    for parent in (out_dir, *out_dir.parents):
        if parent.exists():
            if not parent.is_dir():
                what = "exists and is not a folder" if parent == out_dir else f"{parent} is a file"
                raise OutputDirError(f"{out_dir}: output path {what}")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputDirError(f"{out_dir}: cannot write results there ({parent})")
            return


@contextmanager
def staged_folder(out_dir: Path, outputs: Sequence[str] = ()) -> Iterator[Path]:
    """A tool's output folder, replaced atomically as a run's is: the tool writes into the
    yielded staging folder; when its block completes, the earlier files of the same names (and
    any matching the glob patterns `outputs`, relative to `out_dir`) are swapped for the staged
    ones (commit); when it fails or is stopped, the staging folder is deleted and `out_dir` keeps
    the earlier results byte for byte. Anything else in `out_dir` is left alone."""
    stage = claim_folder(out_dir)
    try:
        yield stage
    except BaseException:
        discard(out_dir)
        raise
    staged = [p.relative_to(stage) for p in stage.rglob("*") if p.is_file()]
    owned = {out_dir / rel for rel in staged if (out_dir / rel).is_file()}
    owned |= {p for pattern in outputs for p in out_dir.glob(pattern) if p.is_file()}
    owned = {p for p in owned if not hidden(p, out_dir)}
    with signals_deferred():  # a stop must not cut the swap short
        commit(out_dir, sorted(owned))


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP arriving inside are delivered when it ends (main thread)."""
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def discard(out_dir: Path) -> None:
    """A failed or stopped run: delete its staging folder; the earlier results stay as they were."""
    shutil.rmtree(out_dir / STAGING, ignore_errors=True)


def commit(out_dir: Path, owned: list[Path] | None = None) -> None:
    """A complete run: move the earlier outputs (`owned`, by default the runner's own files) to
    the trash, mark it complete, move the staged files in, delete both folders and the earlier
    `.hydra/` (backup_hydra)."""
    trash = out_dir / TRASH
    trash.mkdir(exist_ok=True)
    _move_all(owned_files(out_dir) if owned is None else owned, out_dir, trash)
    trace = out_dir / "trace"
    for cell_dir in sorted(trace.iterdir()) if trace.is_dir() else []:
        if cell_dir.is_dir() and not any(cell_dir.iterdir()):
            cell_dir.rmdir()
    (trash / SWAP_DONE).touch()
    _install(out_dir)


def heal(out_dir: Path) -> bool:
    """Finish or undo what a run killed in `out_dir` left; True when the folder holds the last
    started run's results (nothing to heal, or a swap rolled forward), False when that run's
    outputs were discarded (a swap rolled back, a staging folder deleted)."""
    stage, trash = out_dir / STAGING, out_dir / TRASH
    if (trash / SWAP_DONE).exists():
        _install(out_dir)
        return True
    undone = trash.is_dir() or stage.exists()
    if trash.is_dir():
        _move_all([p for p in trash.rglob("*") if p.is_file()], trash, out_dir)
        shutil.rmtree(trash)
    shutil.rmtree(stage, ignore_errors=True)
    return not undone


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


def drop_hydra_backup(out_dir: Path) -> None:
    """A complete run: the earlier `.hydra/` is no longer needed."""
    shutil.rmtree(out_dir / HYDRA_BACKUP, ignore_errors=True)


def _move_all(files: list[Path], src: Path, dst: Path) -> None:
    for path in files:
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


def _install(out_dir: Path) -> None:
    stage = out_dir / STAGING
    if stage.is_dir():
        _move_all(sorted(p for p in stage.rglob("*") if p.is_file()), stage, out_dir)
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(out_dir / TRASH, ignore_errors=True)
    drop_hydra_backup(out_dir)  # the earlier `.hydra/` went with the earlier results


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
