"""How a run or sweep ends when it is told to stop: SIGTERM and SIGHUP behave like SIGINT, and no
worker process outlives its parent.

SIGINT already unwound a run cleanly (KeyboardInterrupt). SIGTERM (a scheduler, `kill`, a closed
container) and SIGHUP (a closed terminal) killed only the parent: spawn and loky workers went on
simulating and writing. Files are written to temporary names and renamed (runner, recorder), so an
interrupted run leaves no half-written file, and the next run into the folder removes the leftovers
(outdir.claim).
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
PARENT_POLL_S = 0.5  # how often a worker checks that its parent is still there
_watching = False


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def exit_status(err: KeyboardInterrupt) -> int:
    """128 + the signal number, as a shell reports a process killed by it (SIGINT when unnamed)."""
    for signum in (*STOP_SIGNALS, signal.SIGINT):
        if signum.name in str(err):
            return 128 + int(signum)
    return 128 + int(signal.SIGINT)


def install_signal_handlers() -> None:
    """In the main process: SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT does, so the
    run unwinds (workers stopped, telemetry closed) and exits non-zero."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_interrupt)


def exit_with_parent() -> None:
    """In a worker process: exit as soon as the parent is gone (reparented to another pid), so a
    killed parent leaves no orphan that keeps writing. Idempotent per process."""
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(PARENT_POLL_S)
        os._exit(143)  # 128 + SIGTERM: the parent was terminated

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate every worker of `pool` now (an interrupted run must not wait for cells)."""
    # The executor offers no public way to stop running tasks: terminate its processes.
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
