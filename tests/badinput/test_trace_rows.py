"""Bad trace rows of every format: RAISE stops on the row with file, line and field; SKIP keeps
every good row, before and after it, and counts the bad one (issue 15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.traces import TraceError, read_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
BIG = 2**70

# (field, JSON text of the bad value): each becomes line 2 of a three-row Mooncake file.
MOONCAKE_FIELD_VALUES = [
    (field, text)
    for field in ("timestamp", "input_length", "output_length")
    for text in (
        "true",
        "false",
        '"5"',
        "null",
        "[]",
        "{}",
        "NaN",
        "Infinity",
        "-Infinity",
        "1e300",
        str(BIG),
        "-1e309",
    )
] + [
    ("input_length", "-600"),
    ("input_length", "600.5"),
    ("input_length", "0"),
    ("output_length", "-1"),
    ("output_length", "0.5"),
    ("output_length", "0"),
    ("output_length", str(2**63 - 1)),
    ("output_length", "9.3e18"),
    ("output_length", str(2**31)),
    ("timestamp", "1e17"),
    ("timestamp", "-1e17"),
    ("timestamp", str(2**63)),
    ("timestamp", '"2023-01-01"'),
]
MOONCAKE_HASH_VALUES = [
    "[1.5, 2]",
    "[true, 2]",
    f"[{BIG}, 2]",
    '["1", 2]',
    "[null, 2]",
    "1",
    '"x"',
    "[1, 1]",
    "[9]",
    "[9, 10, 11]",
    "{}",
    "[[1], 2]",
    f"[{2**63}, 2]",
    f"[-{2**63 + 1}, 2]",
    "[1e400, 2]",
    "[NaN, 2]",
]
MOONCAKE_LINES = [
    "[]",
    "1",
    "null",
    '"x"',
    "{",
    "{}",
    "\x7f",
    '{"timestamp": 1',
    "[1, 2, 3]",
    "true",
    '{"timestamp": 1}{"timestamp": 2}',
    "{" * 5000,
]


def _mooncake(tmp_path: Path, line: str) -> Path:
    rows = [json.dumps(GOOD), line, json.dumps(GOOD | {"timestamp": 30, "hash_ids": [7, 8]})]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def _row(field: str, text: str) -> str:
    body = dict(GOOD, timestamp=20, hash_ids=[5, 6])
    body[field] = "@@"
    return json.dumps(body).replace('"@@"', text)


def _check(fmt: TraceFormat, path: Path, field: str | None, line: int = 2) -> None:
    with pytest.raises(TraceError) as err:
        read_trace(fmt, path, OnError.RAISE)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}:"), message
    assert "\n" not in message
    if field is not None:
        assert field in message or "JSON" in message, message
    table = read_trace(fmt, path, OnError.SKIP)
    assert table.num_skipped == 1, table.skipped
    assert table.line.tolist() == [line - 1, line + 1]


@pytest.mark.parametrize(("field", "text"), MOONCAKE_FIELD_VALUES)
def test_mooncake_bad_field_names_line_and_field(tmp_path: Path, field: str, text: str) -> None:
    _check(TraceFormat.MOONCAKE, _mooncake(tmp_path, _row(field, text)), field)


@pytest.mark.parametrize("text", MOONCAKE_HASH_VALUES)
def test_mooncake_bad_hash_ids_never_coerced(tmp_path: Path, text: str) -> None:
    _check(TraceFormat.MOONCAKE, _mooncake(tmp_path, _row("hash_ids", text)), "hash")


@pytest.mark.parametrize("line", MOONCAKE_LINES)
def test_mooncake_bad_line_is_named(tmp_path: Path, line: str) -> None:
    _check(TraceFormat.MOONCAKE, _mooncake(tmp_path, line), None)


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_GOOD = ["2023-11-16 18:15:46.6805900", "374", "44"]
CELLS = [
    "",
    "x",
    "-1",
    "1.5",
    "0",
    "NaN",
    "inf",
    "-inf",
    "1e300",
    str(2**63),
    str(2**31),
    "true",
    "0x10",
    "1_000",
]
STAMPS = [
    "",
    "x",
    "2023-13-01 00:00:00.0",
    "2023-11-16",
    "NaN",
    "1700000000",
    "99999-01-01 1:1:1",
    "2023-11-16 18:15:40.0000000",
]  # the last one goes backwards


def _csv(tmp_path: Path, header: str, good: list[str], bad: list[str], name: str) -> Path:
    later = list(good)
    if header == AZURE_HEADER:
        later[0] = "2023-11-16 18:15:50.0000000"
    path = tmp_path / name
    path.write_text("\n".join([header, ",".join(good), ",".join(bad), ",".join(later)]) + "\n")
    return path


@pytest.mark.parametrize(
    ("column", "cell"), [(c, v) for c in (1, 2) for v in CELLS] + [(0, v) for v in STAMPS]
)
def test_azure_bad_cell_names_line_and_field(tmp_path: Path, column: int, cell: str) -> None:
    bad = list(AZURE_GOOD)
    bad[0] = "2023-11-16 18:15:48.0000000"
    bad[column] = cell
    path = _csv(tmp_path, AZURE_HEADER, AZURE_GOOD, bad, "azure.csv")
    field = ("timestamp", "input_length", "output_length")[column]
    _check(TraceFormat.AZURE, path, field, line=3)


SHAREGPT_HEADER = "num_prefill_tokens,num_decode_tokens"


@pytest.mark.parametrize(("column", "cell"), [(c, v) for c in (0, 1) for v in CELLS])
def test_sharegpt_bad_cell_names_line_and_field(tmp_path: Path, column: int, cell: str) -> None:
    bad = ["74", "918"]
    bad[column] = cell
    path = _csv(tmp_path, SHAREGPT_HEADER, ["74", "918"], bad, "sharegpt.csv")
    _check(TraceFormat.SHAREGPT, path, ("input_length", "output_length")[column], line=3)


def test_huge_timestamp_under_skip_keeps_the_good_rows_after_it(tmp_path: Path) -> None:
    rows = [
        GOOD,
        dict(GOOD, timestamp=1e17, hash_ids=[3, 4]),
        *(dict(GOOD, timestamp=10 * k, hash_ids=[10 + 2 * k, 11 + 2 * k]) for k in range(1, 6)),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    table = read_trace(TraceFormat.MOONCAKE, path, OnError.SKIP)
    assert table.line.tolist() == [1, 3, 4, 5, 6, 7]
    assert table.arrival_us.tolist() == [0, 10_000, 20_000, 30_000, 40_000, 50_000]
