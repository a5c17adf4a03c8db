"""The one check every entry point's bad input must pass (issue 30): exit status 2, exactly one
line on stderr naming what it must name, no traceback, and not the fallback for an unnamed error."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from cachepilot_sim.entry import TRACEBACK_HINT


def assert_refused(
    main: Callable[[Sequence[str]], int],
    argv: Sequence[str],
    capsys: pytest.CaptureFixture[str],
    *names: str,
) -> str:
    """Run `main(argv)`; assert a named one-line refusal; return the line."""
    status = main(list(argv))
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and TRACEBACK_HINT not in err, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
