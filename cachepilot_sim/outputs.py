"""Output folders that every writer shares (issue 30): a result appears whole or not at all, and
an earlier result is never lost to a failed, refused or stopped rerun.

A writer claims its folder (a staging folder inside it, after healing what a killed writer
left), writes there, and only once it has completed moves the earlier outputs to `<dir>/.trash/`,
marks the trash complete, moves the staged files in and deletes both (commit). A writer that fails
or is stopped deletes its staging folder (discard). A writer killed mid-swap is finished by the
next one (heal): a complete trash means the new files were all staged, so the swap is rolled
forward; an incomplete one is moved back. The run command (experiment/outdir.py) adds its own
file names and Hydra's `.hydra/` backup; the tools use `staged_folder`.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cachepilot_sim.inputs import InputError

STAGING, TRASH, HYDRA_BACKUP = ".staging", ".trash", ".hydra-previous"
SWAP_DONE = ".complete"  # in the trash: every earlier output is in it, the staged files go in next


class OutputDirError(InputError):
    """An output folder that cannot be used; the message names it."""


def hidden(path: Path, root: Path) -> bool:
    """Whether `path` (under `root`) lies in a staging, trash or .hydra backup folder, which
    readers must not take for results."""
    return bool({STAGING, TRASH, HYDRA_BACKUP} & set(path.relative_to(root).parts))


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


def check_file(path: Path) -> None:
    """Refuse, before any work, an output file path that is a folder or whose folder cannot be
    made or written (an existing file is replaced, atomically: write_text)."""
    if path.is_dir():
        raise OutputDirError(f"{path}: output file path is a folder")
    try:
        check_folder(path.parent)
    except OutputDirError as err:
        raise OutputDirError(f"{path}: cannot write the file: {err}") from None


def write_text(path: Path, text: str) -> None:
    """`text` written to a temporary name beside `path` and renamed: a reader (or a stop) never
    sees half a file, and an earlier file stays whole until the new one is complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def commit(out_dir: Path, owned: list[Path]) -> None:
    """A complete writer: move the earlier outputs `owned` to the trash, mark it complete, move
    the staged files in and delete both folders."""
    start_swap(out_dir, owned)
    finish_swap(out_dir)


def start_swap(out_dir: Path, owned: list[Path]) -> None:
    """The commit's first half: the earlier outputs `owned` moved into the trash."""
    trash = out_dir / TRASH
    trash.mkdir(exist_ok=True)
    _move_all(owned, out_dir, trash)


def finish_swap(out_dir: Path) -> None:
    """The commit's second half: the trash marked complete (a swap cut short from here on is
    rolled forward by heal), the staged files moved in, both folders deleted."""
    (out_dir / TRASH / SWAP_DONE).touch()
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
