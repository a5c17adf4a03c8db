"""What a finished run hands back (SimResult), and the error a run that broke the model raises."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl


class SimulationError(RuntimeError):
    """The simulation ended in a state the model forbids (a request never finished, say)."""


class SimResult:
    """Run metrics; the columns of the per-request table that the metrics read (`outcomes`,
    request_log.METRIC_COLUMNS); the whole per-request table and the trace, each read back (from
    its Parquet file or parts when the run wrote them) only when accessed, so that a 10^6-request
    run's caller need hold neither. `requests_path` is the table's file when the run wrote one."""

    def __init__(
        self,
        metrics: dict[str, Any],
        outcomes: pl.DataFrame,
        load_requests: Callable[[], pl.DataFrame],
        load_trace: Callable[[], pl.DataFrame],
        requests_path: Path | None = None,
    ) -> None:
        self.metrics = metrics
        self.outcomes = outcomes
        self.requests_path = requests_path
        self._load_requests = load_requests
        self._load_trace = load_trace

    @cached_property
    def requests(self) -> pl.DataFrame:
        """The whole per-request table (`metrics.REQUEST_SCHEMA`, plus a cluster's `replica`)."""
        return self._load_requests()

    @cached_property
    def trace(self) -> pl.DataFrame:
        return self._load_trace()
