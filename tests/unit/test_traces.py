"""Trace readers: the shipped samples read whole; every kind of bad row stops with file, line and
reason, or is skipped and counted when on_error=SKIP."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.traces import TraceError, read_trace
from tests.conftest import SAMPLES_DIR

MOONCAKE = SAMPLES_DIR / "mooncake_synthetic" / "synthetic_trace.jsonl"
AZURE_CONV = SAMPLES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = SAMPLES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
SHAREGPT = SAMPLES_DIR / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def test_mooncake_sample_reads_every_row_with_its_hash_blocks() -> None:
    t = read_trace(TraceFormat.MOONCAKE, MOONCAKE, OnError.RAISE)
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    assert t.num_requests == len(rows) == 301 and t.num_skipped == 0
    assert t.line.tolist() == list(range(1, 302))
    for i in (0, 17, 300):
        assert t.hash_ids(i).tolist() == rows[i]["hash_ids"]
        assert t.input_tokens[i] == rows[i]["input_length"]
        assert t.arrival_us[i] == (rows[i]["timestamp"] - rows[0]["timestamp"]) * 1000
    blocks = np.diff(t.hash_offsets)
    assert (blocks == -(-t.input_tokens // 512)).all()


@pytest.mark.parametrize("path", [AZURE_CONV, AZURE_CODE])
def test_azure_sample_times_are_relative_microseconds(path: Path) -> None:
    t = read_trace(TraceFormat.AZURE, path, OnError.RAISE)
    assert t.num_requests == 300 and t.arrival_us[0] == 0
    assert (np.diff(t.arrival_us) >= 0).all()
    # Line 3 of the conv file: 18:15:50.9951690 is 4.314579 s after line 2's 18:15:46.6805900.
    if path == AZURE_CONV:
        assert t.arrival_us[1] == 4_314_579
        assert (t.input_tokens[0], t.output_tokens[0]) == (374, 44)


def test_sharegpt_sample_has_lengths_and_no_times() -> None:
    t = read_trace(TraceFormat.SHAREGPT, SHAREGPT, OnError.RAISE)
    assert t.num_requests == 300 and (t.arrival_us == 0).all()
    assert (t.input_tokens[0], t.output_tokens[0]) == (74, 918)


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _jsonl(tmp_path: Path, bad_line: str) -> Path:
    """Three good rows with `bad_line` as line 3."""
    rows = [
        json.dumps(GOOD),
        json.dumps(GOOD | {"timestamp": 10, "hash_ids": [3, 4]}),
        bad_line,
        json.dumps(GOOD | {"timestamp": 30, "hash_ids": [7, 8]}),
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


ROW_5_6 = '"output_length": 5, "hash_ids": [5, 6]}'
BAD_MOONCAKE_ROWS = {
    "missing or non-numeric field 'output_length'": (
        '{"timestamp": 20, "input_length": 600, "hash_ids": [5, 6]}'
    ),
    "negative 'input_length' = -600": '{"timestamp": 20, "input_length": -600, ' + ROW_5_6,
    "'output_length' is NaN": (
        '{"timestamp": 20, "input_length": 600, "output_length": NaN, "hash_ids": [5, 6]}'
    ),
    "timestamp 5.0 goes backwards (an earlier row has 10.0)": (
        '{"timestamp": 5, "input_length": 600, ' + ROW_5_6
    ),
    "'hash_ids' has 3 entries but input_length 600.0 needs 2 blocks": (
        '{"timestamp": 20, "input_length": 600, "output_length": 5, "hash_ids": [5, 6, 9]}'
    ),
    "not a valid JSON request": '{"timestamp": 20, "input_length": 600,',
    "hash id 4 follows id 1 here but 3 on line 2": (
        '{"timestamp": 20, "input_length": 600, "output_length": 5, "hash_ids": [1, 4]}'
    ),
    "'input_length' = 600.5 is not a whole number": (
        '{"timestamp": 20, "input_length": 600.5, ' + ROW_5_6
    ),
}


@pytest.mark.parametrize("reason", list(BAD_MOONCAKE_ROWS))
def test_bad_mooncake_row_stops_naming_file_line_and_reason(tmp_path: Path, reason: str) -> None:
    path = _jsonl(tmp_path, BAD_MOONCAKE_ROWS[reason])
    with pytest.raises(TraceError) as err:
        read_trace(TraceFormat.MOONCAKE, path, OnError.RAISE)
    assert f"{path}:3: " in str(err.value)
    assert reason in str(err.value)


@pytest.mark.parametrize("reason", list(BAD_MOONCAKE_ROWS))
def test_skip_policy_counts_the_bad_row_and_keeps_the_rest(tmp_path: Path, reason: str) -> None:
    path = _jsonl(tmp_path, BAD_MOONCAKE_ROWS[reason])
    t = read_trace(TraceFormat.MOONCAKE, path, OnError.SKIP)
    assert t.num_requests == 3 and t.num_skipped == 1
    assert t.line.tolist() == [1, 2, 4]
    assert [t.hash_ids(i).tolist() for i in range(3)] == [[1, 2], [3, 4], [7, 8]]
    assert t.arrival_us.tolist() == [0, 10_000, 30_000]


def test_blank_lines_keep_line_numbers_right(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + '{"timestamp": 1}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:3: missing or non-numeric field"):
        read_trace(TraceFormat.MOONCAKE, path, OnError.RAISE)


def test_skipped_rows_are_counted_per_reason(tmp_path: Path) -> None:
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:47.0000000,-3,44",
        "2023-11-16 18:15:47.5000000,-7,44",
        "yesterday,10,10",
        "2023-11-16 18:15:48.0000000,NaN,4",
        "2023-11-16 18:15:40.0000000,10,4",
        "2023-11-16 18:15:49.0000000,,4",
        "2023-11-16 18:15:50.0000000,100,7",
    ]
    path = tmp_path / "az.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"az\.csv:3: negative 'input_length' = -3"):
        read_trace(TraceFormat.AZURE, path, OnError.RAISE)
    t = read_trace(TraceFormat.AZURE, path, OnError.SKIP)
    assert t.line.tolist() == [2, 9] and t.input_tokens.tolist() == [374, 100]
    assert t.skipped == {
        "negative 'input_length' = N": 2,
        "missing or unparseable 'timestamp'": 1,
        "'input_length' is NaN": 1,
        "missing or non-numeric field 'input_length'": 1,
        "timestamp N goes backwards (an earlier row has N)": 1,
    }
    assert t.num_skipped == len(lines) - 1 - t.num_requests


def test_csv_without_a_needed_column_names_the_header(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,Tokens\n2023-11-16 18:15:46.68,3\n")
    with pytest.raises(TraceError, match=r"az\.csv:1: header lacks column\(s\) \['ContextTokens'"):
        read_trace(TraceFormat.AZURE, path, OnError.RAISE)


def test_missing_file_says_how_to_point_at_traces(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="CACHEPILOT_TRACES_DIR"):
        read_trace(TraceFormat.AZURE, tmp_path / "nope.csv", OnError.RAISE)


def test_a_trace_with_only_bad_rows_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n-1,2\n")
    with pytest.raises(TraceError, match="no valid requests"):
        read_trace(TraceFormat.SHAREGPT, path, OnError.SKIP)
