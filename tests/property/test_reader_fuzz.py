"""Hypothesis fuzz of the trace readers (issue 15): random bytes, random JSON values and random CSV
cells give a TraceTable or a TraceError, never another exception, and a row that is accepted holds
exactly the values the file says."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.traces import TraceError, TraceTable, read_trace

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=6,
)


def _read(fmt: TraceFormat, content: bytes, on_error: OnError) -> TraceTable | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("t.jsonl" if fmt == TraceFormat.MOONCAKE else "t.csv")
        path.write_bytes(content)
        try:
            return read_trace(fmt, path, on_error)
        except TraceError as err:
            assert str(path) in str(err)
            return None


@FUZZ
@given(st.sampled_from(list(TraceFormat)[1:]), st.binary(max_size=300), st.sampled_from(OnError))
def test_random_bytes_give_a_table_or_a_trace_error(
    fmt: TraceFormat, content: bytes, on_error: OnError
) -> None:
    _read(fmt, content, on_error)


@FUZZ
@given(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]), JSON_VALUES)
def test_a_random_json_value_is_refused_or_read_exactly(field: str, value: object) -> None:
    row = {"timestamp": 5, "input_length": 600, "output_length": 7, "hash_ids": [1, 2]}
    row[field] = value
    text = json.dumps(row)  # Python writes NaN/Infinity literals: the reader must handle them
    table = _read(TraceFormat.MOONCAKE, text.encode() + b"\n", OnError.RAISE)
    if table is None:
        return
    assert not isinstance(value, bool) and value is not None
    assert table.num_requests == 1
    assert int(table.input_tokens[0]) == row["input_length"]
    assert int(table.output_tokens[0]) == row["output_length"]
    assert table.hash_ids(0).tolist() == row["hash_ids"]


CELLS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.-+eE xnaifINF_", max_size=8),
)


@FUZZ
@given(CELLS, CELLS)
def test_random_sharegpt_cells_are_refused_or_read_exactly(prefill: str, decode: str) -> None:
    content = f"num_prefill_tokens,num_decode_tokens\n{prefill},{decode}\n".encode()
    table = _read(TraceFormat.SHAREGPT, content, OnError.RAISE)
    if table is None:
        return
    assert float(prefill.strip()) == int(table.input_tokens[0])
    assert float(decode.strip()) == int(table.output_tokens[0])
