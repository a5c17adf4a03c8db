"""The per-request table streamed as requests end (request_log.py) and the clients that hold only
the requests in flight: the same table, byte for byte where it fits one chunk, as building it from
every Request at the end."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.components.request import Outcome
from cachepilot_sim.metrics import REQUEST_SCHEMA, request_frame
from cachepilot_sim.request_log import METRIC_COLUMNS, RequestLog
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload


def kept_run(tmp_path: Path, chunk_rows: int, **overrides):  # noqa: ANN003, ANN201
    """A run whose table streams to a file in chunks of `chunk_rows`, and the Requests it made
    (kept aside by a watcher, to build the reference table)."""
    sim = build(make_sim_config(**overrides), requests_path=tmp_path / "requests.parquet")
    sim.log.chunk_rows = chunk_rows
    ended = []
    sim.clients.on_end.append(ended.append)
    result = sim.run()
    reference = request_frame(
        sorted(ended, key=lambda r: r.req_id), sim.clients.class_names, sim.clients.ttft_slo_us
    )
    return sim, result, reference


def test_one_chunk_writes_the_file_write_parquet_writes(tmp_path: Path) -> None:
    sim, result, reference = kept_run(tmp_path, chunk_rows=10_000)
    assert result.requests.equals(reference)
    expected = io.BytesIO()
    reference.write_parquet(expected)
    assert (tmp_path / "requests.parquet").read_bytes() == expected.getvalue()
    assert not sim.log.parts_dir.exists()


def test_many_parts_combine_into_the_same_table(tmp_path: Path) -> None:
    sim, result, reference = kept_run(tmp_path, chunk_rows=7)
    assert reference.height > 7 * 3  # several parts were written
    assert pl.read_parquet(tmp_path / "requests.parquet").equals(reference)
    assert not sim.log.parts_dir.exists()  # the parts are gone once combined
    outcomes = result.outcomes.with_columns(pl.col("outcome", "kv_source").cast(pl.Utf8))
    assert outcomes.equals(reference.select(METRIC_COLUMNS))


def test_metrics_over_the_compact_columns_equal_those_over_the_whole_table(tmp_path: Path) -> None:
    sim, result, reference = kept_run(tmp_path, chunk_rows=9)
    assert sim.metrics(reference) == result.metrics


def test_rows_come_in_id_order_whatever_order_requests_end_in() -> None:
    sim = build(make_sim_config(workload=make_workload(num_requests=40)))
    ended = []
    sim.clients.on_end.append(ended.append)
    frame = sim.run().requests
    ids = [r.req_id for r in ended]
    assert ids != sorted(ids)  # some requests ended before earlier ones
    assert frame["request"].to_list() == list(range(40))


def test_clients_hold_only_requests_in_flight() -> None:
    sim = build(make_sim_config(workload=make_workload(num_requests=60)))
    in_flight = []
    sim.clients.on_end.append(lambda _r: in_flight.append(len(sim.clients.pending_ids())))
    sim.run()
    assert sim.clients.pending_ids() == []
    assert max(in_flight) < 60
    with pytest.raises(AttributeError, match="keeps no requests"):
        _ = sim.clients.requests


def test_waiting_sessions_get_slots_in_arrival_order() -> None:
    """One front-end slot and a busy arrival stream: sessions queue, and each starts only when
    the one before it has finished, in the order they arrived (session ids follow that order)."""
    wl = make_workload(num_requests=30, max_active_sessions=1, session_rate_per_s=5.0)
    sim = build(make_sim_config(workload=wl))
    result = sim.run()
    assert sim.clients.num_sessions > 1
    req = result.requests.sort("request")
    first_turns = req.filter(pl.col("turn") == 0)
    assert first_turns["session"].to_list() == sorted(first_turns["session"].to_list())
    assert (first_turns["session_wait_us"] > 0).any()  # someone waited for the slot
    # One slot: a session's first turn is sent after every earlier request has ended.
    for row in first_turns.iter_rows(named=True):
        earlier = req.filter(pl.col("request") < row["request"])
        assert (earlier["finish_us"] <= row["arrival_us"]).all()
    assert set(req["outcome"].to_list()) <= {o.name.lower() for o in Outcome}


def test_an_empty_log_writes_an_empty_table(tmp_path: Path) -> None:
    log = RequestLog(["a"], [1], tmp_path / "r.parquet")
    log.close()
    assert pl.read_parquet(tmp_path / "r.parquet").schema == REQUEST_SCHEMA
    assert log.metric_frame().height == 0
