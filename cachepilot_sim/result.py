"""What a finished run hands back (SimResult), and the error a run that broke the model raises."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import polars as pl


class SimulationError(RuntimeError):
    """The simulation ended in a state the model forbids (a request never finished, say)."""


class SimResult:
    """Run metrics, per-request results, and the trace, which is read back from its Parquet parts
    only when accessed (a 10^6-request run's caller need never hold the whole trace)."""

    def __init__(
        self,
        metrics: dict[str, Any],
        requests: pl.DataFrame,
        load_trace: Callable[[], pl.DataFrame],
    ) -> None:
        self.metrics = metrics
        self.requests = requests
        self._load_trace = load_trace

    @cached_property
    def trace(self) -> pl.DataFrame:
        return self._load_trace()
