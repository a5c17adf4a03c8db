"""The per-request table, written as requests end instead of from every Request at the run's end.

A 10^6-request run cannot keep a million `Request` objects (each with its SimPy event) until it
ends, nor build its table from a Python list per column at once. `RequestLog` takes each request
when it ends, puts its row (`metrics.request_row`) in request-id order (a request that ends before
an earlier one waits in a small reorder buffer: at most the requests in flight), and hands chunks
of `chunk_rows` rows to polars. With an output path the chunks become Parquet parts beside it,
combined into the one file at the end by polars' streaming engine (`sink_parquet`), never loading
the whole table; a run of at most one chunk writes its frame with `write_parquet` as before, byte
for byte. Without a path the chunks stay in memory (tests, a plan search on small runs).

The run metrics read only a few columns (`METRIC_COLUMNS`); those stay in memory, as compact
polars chunks (numbers, and the two labels as `pl.Enum`: four bytes a row), so that
`metrics.request_metrics` and `experiment/serving.py` see the same values in the same order.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from polars.datatypes import DataType

from cachepilot_sim.components.request import KvSource, Outcome, Request
from cachepilot_sim.metrics import REQUEST_SCHEMA, request_row

# The per-request columns the run metrics and the serving statistics read.
METRIC_COLUMNS = (
    "turn",
    "finish_us",
    "prompt_tokens",
    "generated",
    "outcome",
    "kv_source",
    "ttft_us",
    "tpot_us",
    "e2e_us",
    "sla_met",
    "session_wait_us",
)
# A column after REQUEST_SCHEMA's: its type and its value for a request (the cluster's replica).
ExtraColumn = tuple[DataType, Callable[[Request], Any]]
_LABELS = {
    "outcome": pl.Enum([o.name.lower() for o in Outcome]),
    "kv_source": pl.Enum([s.name.lower() for s in KvSource]),
}


class RequestLog:
    """Rows of ended requests in id order, in chunks; on disk when `out_path` is given."""

    def __init__(
        self,
        class_names: Sequence[str],
        ttft_slo_us: Sequence[int],
        out_path: Path | None = None,
        session_of: Sequence[int] | np.ndarray | None = None,
        extra: Mapping[str, ExtraColumn] | None = None,
        chunk_rows: int = 50_000,
    ) -> None:
        self.class_names = list(class_names)
        self.ttft_slo_us = list(ttft_slo_us)
        self.out_path = out_path
        self.session_of = session_of  # replay: row i's session is the inferred one, session_of[i]
        self.extra = dict(extra or {})
        self.schema = pl.Schema(
            {**REQUEST_SCHEMA, **{name: dtype for name, (dtype, _) in self.extra.items()}}
        )
        self.chunk_rows = chunk_rows
        self.streaming = False  # rows come as requests end (`end`), not all at the end (`add`)
        self.num_rows = 0  # rows taken into chunks
        self._waiting: dict[int, tuple[Any, ...]] = {}  # ended before an earlier request
        self._rows: list[tuple[Any, ...]] = []  # the open chunk
        self._chunks: list[pl.DataFrame] = []  # whole chunks: in memory only without out_path
        self._metric_chunks: list[pl.DataFrame] = []
        self._num_parts = 0

    @property
    def parts_dir(self) -> Path:
        """Where the Parquet parts wait until `close` combines them (removed then)."""
        assert self.out_path is not None
        return self.out_path.with_name(self.out_path.name + ".parts")

    def end(self, r: Request) -> None:
        """Take request `r`, which has just completed or been rejected; its row goes in after
        those of every request with a smaller id (ids count from 0 without gaps)."""
        if r.req_id != self.num_rows:
            self._waiting[r.req_id] = self._row(r)
            return
        self._append(self._row(r))
        while self.num_rows in self._waiting:
            self._append(self._waiting.pop(self.num_rows))

    def add(self, r: Request) -> None:
        """Take request `r`'s row now, after the rows taken so far."""
        self._append(self._row(r))

    def _row(self, r: Request) -> tuple[Any, ...]:
        row = request_row(r, self.class_names, self.ttft_slo_us)
        if self.session_of is not None:
            row = (row[0], int(self.session_of[r.req_id]), *row[2:])
        return (*row, *(value(r) for _, value in self.extra.values()))

    def _append(self, row: tuple[Any, ...]) -> None:
        self._rows.append(row)
        self.num_rows += 1
        if len(self._rows) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        cols = zip(*self._rows, strict=True)  # rows to columns, in C
        columns = {name: list(c) for name, c in zip(self.schema.names(), cols, strict=True)}
        frame = pl.DataFrame(columns, schema=self.schema)
        self._rows = []
        self._metric_chunks.append(
            frame.select(*METRIC_COLUMNS, *self.extra).with_columns(
                pl.col(name).cast(dtype) for name, dtype in _LABELS.items()
            )
        )
        if self.out_path is None:
            self._chunks.append(frame)
            return
        if self._num_parts == 0:  # the first part: hold it; a one-chunk run writes it as is
            self._chunks.append(frame)
        else:
            if self._num_parts == 1:
                self._write_part(0, self._chunks.pop())
            self._write_part(self._num_parts, frame)
        self._num_parts += 1

    def _write_part(self, k: int, frame: pl.DataFrame) -> None:
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(self.parts_dir / f"part-{k:05d}.parquet")

    def close(self) -> None:
        """Write the last rows; with an output path, the one Parquet file (temporary name, then
        renamed). Every request must have ended: a waiting row means one never did."""
        if self._waiting:
            first = min(self._waiting)
            raise RuntimeError(f"request log: request {self.num_rows} never ended (next: {first})")
        self._flush()
        if self.out_path is None:
            return
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out_path.with_name(self.out_path.name + ".tmp")
        if self._num_parts <= 1:
            frame = self._chunks.pop() if self._chunks else self.schema.to_frame()
            frame.write_parquet(tmp)
        else:
            parts = [self.parts_dir / f"part-{k:05d}.parquet" for k in range(self._num_parts)]
            pl.scan_parquet(parts, schema=self.schema, glob=False).sink_parquet(tmp)
            shutil.rmtree(self.parts_dir)
        os.replace(tmp, self.out_path)

    def frame(self) -> pl.DataFrame:
        """The whole table (read back from the file when it was written to disk)."""
        if self.out_path is not None:
            return pl.read_parquet(self.out_path, glob=False)
        return pl.concat(self._chunks) if self._chunks else self.schema.to_frame()

    def metric_frame(self) -> pl.DataFrame:
        """`METRIC_COLUMNS` of every row, the labels as `pl.Enum` (compare them with strings)."""
        if not self._metric_chunks:
            return self.schema.to_frame().select(*METRIC_COLUMNS, *self.extra)
        return pl.concat(self._metric_chunks, rechunk=True)
