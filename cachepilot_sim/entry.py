"""How every command ends on a bad input or a stop signal (issue 30): one line on stderr, exit
status 2 for a bad input (inputs.InputError, an OSError), 128 + the signal for SIGINT, SIGTERM
and SIGHUP (the last two raise KeyboardInterrupt, as SIGINT does, so a command unwinds: workers
stopped, staging folders deleted), never a traceback unless CACHEPILOT_TRACEBACK is set."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from cachepilot_sim.inputs import InputError, one_line

# The fallback's marker: an error that no reader named (a bug, or a gap to close).
TRACEBACK_HINT = "(CACHEPILOT_TRACEBACK=1 shows the traceback)"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


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
                print(f"{prog}: {err or 'stopped by SIGINT'}; nothing was written", file=sys.stderr)
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
