"""Collects trace rows in column lists and hands them to polars in chunks.

With an output directory the chunks become numbered Parquet part files, so a long run never holds
its whole trace in memory; without one they stay in memory (tests, notebooks on tiny runs). Tracing
can be off (`NullRecorder`) or keep one session in k (`SampledRecorder`): every row of a kept
session, so per-request results derived from a sampled trace are exact for the sessions it holds.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.trace.schema import TRACE_SCHEMA

META_FILE = "meta.json"
NAN = math.nan


class TraceRecorder:
    """Append-only event rows; `emit` is on the simulator's hot path, so it only appends."""

    def __init__(self, out_dir: Path | None = None, chunk_rows: int = 200_000) -> None:
        self.out_dir = out_dir
        self.chunk_rows = chunk_rows
        self._cols: list[list] = [[] for _ in TRACE_SCHEMA]
        self._chunks: list[pl.DataFrame] = []
        self._num_parts = 0
        self._claimed = False  # an earlier run's files in out_dir removed (see _claim_dir)
        self.num_rows = 0

    def emit(
        self,
        t_us: int,
        component: str,
        kind: str,
        session: int = -1,
        request: int = -1,
        model: int = 0,
        blocks: int = 0,
        num_bytes: int = 0,
        tier: str = "none",
        score: float = NAN,
        value: int = 0,
        class_index: int = -1,
        cost_us: float = NAN,
    ) -> None:
        c = self._cols
        c[0].append(t_us)
        c[1].append(self.num_rows)
        c[2].append(component)
        c[3].append(kind)
        c[4].append(session)
        c[5].append(request)
        c[6].append(model)
        c[7].append(blocks)
        c[8].append(num_bytes)
        c[9].append(tier)
        c[10].append(score)
        c[11].append(value)
        c[12].append(class_index)
        c[13].append(cost_us)
        self.num_rows += 1
        if len(c[0]) >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        if not self._cols[0]:
            return
        columns = dict(zip(TRACE_SCHEMA.names(), self._cols, strict=True))
        frame = pl.DataFrame(columns, schema=TRACE_SCHEMA)
        self._cols = [[] for _ in TRACE_SCHEMA]
        if self.out_dir is None:
            self._chunks.append(frame)
            return
        self._claim_dir()
        path = self.out_dir / f"part-{self._num_parts:05d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        frame.write_parquet(tmp)
        os.replace(tmp, path)
        self._num_parts += 1

    def close(self, meta: dict[str, Any]) -> None:
        """Write the last chunk and `meta.json` (what a reader needs besides the rows: class names,
        SLOs, pool size, sampling). The meta file is written last: its presence marks a complete
        trace."""
        self.flush()
        if self.out_dir is None:
            return
        self._claim_dir()
        meta = meta | {"parts": [p.name for p in self._part_paths()]}
        tmp = self.out_dir / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.out_dir / META_FILE)

    def _part_paths(self) -> list[Path]:
        assert self.out_dir is not None
        return [self.out_dir / f"part-{k:05d}.parquet" for k in range(self._num_parts)]

    def _claim_dir(self) -> None:
        """Once, before the first write: remove what an earlier run left in this folder (its
        meta.json first, so an interruption leaves an incomplete trace, never a mixed one)."""
        assert self.out_dir is not None
        if self._claimed:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / META_FILE).unlink(missing_ok=True)
        for stale in (*self.out_dir.glob("part-*.parquet"), *self.out_dir.glob("*.tmp")):
            stale.unlink()
        self._claimed = True

    def frame(self) -> pl.DataFrame:
        """The whole trace (reads the part files back when they were written to disk)."""
        self.flush()
        if self.out_dir is not None:
            if self._num_parts == 0:
                return TRACE_SCHEMA.to_frame()
            # glob=False: a sweep folder named `compare_policies=[perc]` is a path, not a pattern
            return pl.read_parquet(self._part_paths(), schema=TRACE_SCHEMA, glob=False)
        if not self._chunks:
            return TRACE_SCHEMA.to_frame()
        return pl.concat(self._chunks)


class SampledRecorder(TraceRecorder):
    """Keeps every row of one session in `session_every` (session id % k == 0) and every row not
    about a session (iterations, run end). Session ids follow arrival order, so the kept sessions
    spread evenly over the run and over workload classes."""

    def __init__(self, out_dir: Path | None, chunk_rows: int, session_every: int) -> None:
        super().__init__(out_dir, chunk_rows)
        self.session_every = session_every

    def emit(
        self,
        t_us: int,
        component: str,
        kind: str,
        session: int = -1,
        request: int = -1,
        model: int = 0,
        blocks: int = 0,
        num_bytes: int = 0,
        tier: str = "none",
        score: float = NAN,
        value: int = 0,
        class_index: int = -1,
        cost_us: float = NAN,
    ) -> None:
        if session < 0 or session % self.session_every == 0:
            TraceRecorder.emit(
                self,
                t_us,
                component,
                kind,
                session,
                request,
                model,
                blocks,
                num_bytes,
                tier,
                score,
                value,
                class_index,
                cost_us,
            )


class NullRecorder(TraceRecorder):
    """Tracing switched off: emit does nothing."""

    def emit(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        return None


def make_recorder(
    out_dir: Path | None, enabled: bool, chunk_rows: int, session_every: int
) -> TraceRecorder:
    """The recorder a run's trace settings ask for."""
    if not enabled:
        return NullRecorder()
    if session_every > 1:
        return SampledRecorder(out_dir, chunk_rows, session_every)
    return TraceRecorder(out_dir, chunk_rows)
