"""Simulated time: SimPy's `env.now` is an integer count of microseconds.

Integer time keeps event order independent of float rounding; these helpers are the only place where
human units (seconds, milliseconds) become simulation ticks.
"""

from __future__ import annotations

import math

import simpy

US_PER_MS = 1_000
US_PER_S = 1_000_000


def s_to_us(seconds: float) -> int:
    """Seconds -> integer microseconds, rounded to nearest."""
    return int(round(seconds * US_PER_S))


def ms_to_us(milliseconds: float) -> int:
    """Milliseconds -> integer microseconds, rounded to nearest."""
    return int(round(milliseconds * US_PER_MS))


def ceil_us(duration_us: float) -> int:
    """A modelled duration rounded up to whole microseconds (never zero for non-zero work)."""
    return 0 if duration_us <= 0 else math.ceil(duration_us)


class SimEnvironment(simpy.Environment):
    """A `simpy.Environment` whose clock is typed as what it holds here: integer microseconds."""

    def __init__(self) -> None:
        super().__init__(initial_time=0)

    @property
    def now(self) -> int:  # type: ignore[override]
        return self._now  # type: ignore[return-value]
