"""How every command ends on a bad input or a stop signal (issue 30): one line on stderr, exit
status 2 for a bad input (inputs.InputError, an OSError), 128 + the signal for SIGINT, SIGTERM
and SIGHUP (the last two raise KeyboardInterrupt, as SIGINT does, so a command unwinds: workers
stopped, staging folders deleted), never a traceback unless CACHEPILOT_TRACEBACK is set."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from cachepilot_sim.inputs import InputError, one_line

# The fallback's marker: an error that no reader named (a bug, or a gap to close).
TRACEBACK_HINT = "(CACHEPILOT_TRACEBACK=1 shows the traceback)"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# What a worker leaves to its parent: a Ctrl-C or a closed terminal reaches the whole process
# group; SIGTERM stays, the parent stops its workers with it.
WORKER_DEAF = {signal.SIGINT, signal.SIGHUP}
PARENT_POLL_S = 0.5  # how often a worker checks that its parent is still there
# The pid of the process that launches a `--multirun` sweep (set before its launcher starts
# workers, which inherit it): a job that runs in another process is in a launcher worker.
SWEEP_PARENT_ENV = "CACHEPILOT_SWEEP_PARENT"
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
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (a tool called from a worker thread)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_interrupt)


def exit_with_parent(parent: int | None = None) -> None:
    """In a worker process: exit as soon as the parent is gone (reparented to another pid), so a
    killed parent leaves no orphan that keeps writing. Idempotent per process.

    `parent` is the pid the worker belongs to: a pool passes its own (`initargs`), so a worker that
    finishes starting only after its parent was killed (it is then already reparented, and
    `os.getppid()` would name its new parent) exits at once instead of waiting forever."""
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(PARENT_POLL_S)
        os._exit(143)  # 128 + SIGTERM: the parent was terminated

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def worker_setup(parent: int) -> None:
    """In a worker process of a tool's pool (plan, sweeps): exit when the parent `parent` is gone
    (exit_with_parent), and leave SIGINT and SIGHUP to the parent: a Ctrl-C or a closed terminal
    reaches the whole process group, and a worker's own KeyboardInterrupt printed a traceback per
    worker; the parent stops its workers itself. Idempotent."""
    if threading.current_thread() is threading.main_thread():
        for signum in WORKER_DEAF:
            signal.signal(signum, signal.SIG_IGN)
        # Started inside workers_starting(): a Ctrl-C that came while this worker was still
        # starting waits, blocked, and is discarded here, being ignored now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_DEAF)
    exit_with_parent(parent)


@contextlib.contextmanager
def workers_starting() -> Iterator[None]:
    """Wrap the start of a pool's worker processes (in the main thread): SIGINT and SIGHUP are
    blocked inside, so a process started here inherits them blocked (the mask survives fork and
    exec) until its worker_setup ignores them: a Ctrl-C that reached a worker still importing
    raised there and printed its traceback. In this process they are delivered at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Started inside, multiprocessing's resource tracker would unblock SIGINT on its way out
    # (resource_tracker.ensure_running: SIG_UNBLOCK, not the earlier mask): start it first.
    start_mp_tracker()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_DEAF)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_loky_tracker() -> None:
    """Start joblib's loky resource tracker immune to SIGHUP (start_resource_tracker), its
    UserWarnings off: when a stopped plan's workers die with their semaphores, the tracker
    unlinks those (its job) and warned about each on the terminal after the one-line stop."""
    from joblib.externals.loky.backend import resource_tracker

    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, "ignore::UserWarning"]))
    try:
        start_resource_tracker(resource_tracker.ensure_running)
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def start_mp_tracker() -> None:
    """Start multiprocessing's resource tracker (spawn pools) immune to SIGHUP."""
    from multiprocessing import resource_tracker

    start_resource_tracker(resource_tracker.ensure_running)


def start_resource_tracker(ensure_running: Callable[[], None]) -> None:
    """Start a resource tracker (multiprocessing's or loky's) with SIGHUP ignored (the
    disposition survives its exec), before a pool starts it: it ignores SIGINT and SIGTERM
    itself, but a closed terminal's SIGHUP reached it as a member of the tool's process group,
    killed it, and its relaunch printed a KeyError traceback per shared-memory segment."""
    if threading.current_thread() is not threading.main_thread():
        ensure_running()
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def entry_point(prog: str) -> Callable[[Callable[..., Any]], Callable[..., int]]:
    """Decorate a tool's `main(argv)`: its exit status is 0 (or what it returns); an InputError or
    OSError is one line `prog: message` on stderr and status 2; SIGINT (and SIGTERM, SIGHUP, which
    the decorated main installs as interrupts) is one line and 128 + the signal. Any other error
    is one line too, status 2, unless CACHEPILOT_TRACEBACK is set."""

    def wrap(main: Callable[..., Any]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded(argv: Sequence[str] | None = None) -> int:
            install_signal_handlers()
            try:
                status = main(None if argv is None else list(argv))
            except InputError as err:
                return _refuse(f"{prog}: {one_line(err)}")
            except OSError as err:
                return _refuse(f"{prog}: {os_error_line(err)}")
            except KeyboardInterrupt as err:
                print(
                    f"{prog}: {str(err) or 'stopped by SIGINT'}; nothing was written",
                    file=sys.stderr,
                )
                return exit_status(err)
            except Exception as err:
                if os.environ.get("CACHEPILOT_TRACEBACK"):
                    raise
                first = (str(err).strip().splitlines() or [""])[0]
                return _refuse(f"{prog}: {type(err).__name__}: {first} {TRACEBACK_HINT}")
            return int(status or 0)

        return guarded

    return wrap


def _refuse(line: str) -> int:
    print(line, file=sys.stderr)
    return 2


def os_error_line(err: OSError) -> str:
    """An OSError as `FILE: reason` (the file it names, when it names one)."""
    reason = err.strerror or one_line(err) or type(err).__name__
    return f"{err.filename}: {reason}" if err.filename else reason
