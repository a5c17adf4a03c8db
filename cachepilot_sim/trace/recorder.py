"""Collects trace rows in column lists and hands them to polars in chunks.

With an output directory the chunks become numbered Parquet part files, so a long run never holds
its whole trace in memory; without one they stay in memory (tests, notebooks on tiny runs).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from cachepilot_sim.trace.schema import TRACE_SCHEMA


class TraceRecorder:
    """Append-only event rows; `emit` is on the simulator's hot path, so it only appends."""

    def __init__(self, out_dir: Path | None = None, chunk_rows: int = 200_000) -> None:
        self.out_dir = out_dir
        self.chunk_rows = chunk_rows
        self._cols: list[list] = [[] for _ in TRACE_SCHEMA]
        self._chunks: list[pl.DataFrame] = []
        self._num_parts = 0
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
        score: float = float("nan"),
        value: int = 0,
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
        self.num_rows += 1
        if len(c[0]) >= self.chunk_rows:
            self.flush()

    def flush(self) -> None:
        if not self._cols[0]:
            return
        frame = pl.DataFrame(
            dict(zip(TRACE_SCHEMA.names(), self._cols, strict=False)), schema=TRACE_SCHEMA
        )
        self._cols = [[] for _ in TRACE_SCHEMA]
        if self.out_dir is None:
            self._chunks.append(frame)
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(self.out_dir / f"part-{self._num_parts:05d}.parquet")
        self._num_parts += 1

    def frame(self) -> pl.DataFrame:
        """The whole trace (reads the part files back when they were written to disk)."""
        self.flush()
        if self.out_dir is not None:
            if self._num_parts == 0:
                return TRACE_SCHEMA.to_frame()
            return pl.read_parquet(self.out_dir / "part-*.parquet", schema=TRACE_SCHEMA)
        if not self._chunks:
            return TRACE_SCHEMA.to_frame()
        return pl.concat(self._chunks)


class NullRecorder(TraceRecorder):
    """Tracing switched off: emit does nothing."""

    def emit(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        return None
