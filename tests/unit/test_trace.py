from __future__ import annotations

from pathlib import Path

import polars as pl

from cachepilot_sim.sim import build
from cachepilot_sim.trace.recorder import TraceRecorder
from cachepilot_sim.trace.schema import EVENT_KINDS, TRACE_SCHEMA
from tests.conftest import make_sim_config


def test_recorder_writes_parquet_parts_in_chunks_and_reads_them_back(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, chunk_rows=10)
    for i in range(25):
        rec.emit(i, "kv", "evict_drop", session=i, num_bytes=100 * i)
    frame = rec.frame()
    assert len(list(tmp_path.glob("part-*.parquet"))) == 3
    assert frame.schema == TRACE_SCHEMA
    assert frame["session"].to_list() == list(range(25))


def test_simulation_trace_uses_the_schema_and_its_event_kinds(tmp_path: Path) -> None:
    sim = build(make_sim_config(), trace_dir=tmp_path)
    trace = sim.run().trace
    assert trace.schema == TRACE_SCHEMA
    kinds = set(trace["kind"].cast(pl.Utf8).unique().to_list())
    assert {"arrive", "admit", "first_token", "finish", "evict_offload", "reload_done"} <= kinds
    assert kinds <= set(EVENT_KINDS)
    # Every finished request is in the trace exactly once.
    finishes = trace.filter(pl.col("kind") == "finish")["request"]
    assert finishes.n_unique() == finishes.len() == sim.metrics()["completed"]
