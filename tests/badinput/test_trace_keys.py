"""Trace readers (issue 30): a Mooncake field given twice is refused by the fast and the slow
decode alike (they read it differently before); a hash id equal to the old first-block sentinel
(-1) is an id like any other; a CSV column named twice is refused, not resolved to one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.traces import TraceError, read_trace

GOOD = '{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}'


BASE = '"timestamp": 1, "input_length": 512, "output_length": 4, "hash_ids": [7]'
TWICE = {
    "timestamp": '"timestamp": 5',
    "input_length": '"input_length": 9',
    "output_length": '"output_length": 8',
    "hash_ids": '"hash_ids": [8]',
    "hash_ids, fractional second": '"hash_ids": [1.5]',
}
# A `true` on a later line sends the whole file to the strict slow decode.
TRIGGER = '{"timestamp": 2, "input_length": 512, "output_length": 4, "hash_ids": [true]}'


@pytest.mark.parametrize("field", TWICE)
@pytest.mark.parametrize("slow", [False, True], ids=["fast path", "slow path"])
def test_a_field_given_twice_is_refused_by_both_decodes(
    tmp_path: Path, field: str, slow: bool
) -> None:
    path = tmp_path / "t.jsonl"
    lines = [GOOD, "{" + BASE + ", " + TWICE[field] + "}"] + ([TRIGGER] if slow else [])
    path.write_text("\n".join(lines) + "\n")
    name = field.split(",")[0]
    with pytest.raises(TraceError, match=rf"t\.jsonl:2: .*'{name}' given twice"):
        read_trace(TraceFormat.MOONCAKE, path, OnError.RAISE)
    assert read_trace(TraceFormat.MOONCAKE, path, OnError.SKIP).num_requests == 1


def test_an_unknown_key_given_twice_is_read_by_both_paths_alike(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD.replace("{", '{"note": 1, "note": 2, ', 1) + "\n")
    assert read_trace(TraceFormat.MOONCAKE, path, OnError.RAISE).num_requests == 1


def test_hash_id_minus_one_is_an_id_not_the_first_block(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # line 1: id 5 follows id -1; line 2: id 5 is a first block: two different prefixes
    path.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [-1, 5]}\n'
        '{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [5]}\n'
    )
    with pytest.raises(TraceError, match=r"t\.jsonl:2: hash id 5 follows no id"):
        read_trace(TraceFormat.MOONCAKE, path, OnError.RAISE)
    table = read_trace(TraceFormat.MOONCAKE, path, OnError.SKIP)
    assert table.num_requests == 1 and list(table.hash_ids(0)) == [-1, 5]


@pytest.mark.parametrize(
    ("fmt", "header", "row"),
    [
        (TraceFormat.AZURE, "TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens",
         "2023-11-16 18:15:46.6805900,100,7,10"),
        (TraceFormat.AZURE, "TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP",
         "2023-11-16 18:15:46.6805900,100,10,2023-11-16 18:15:47.0"),
    ],
)  # fmt: skip
def test_a_csv_column_named_twice_is_refused(
    tmp_path: Path, fmt: TraceFormat, header: str, row: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: header names column\(s\) .* more than once"):
        read_trace(fmt, path, OnError.RAISE)
