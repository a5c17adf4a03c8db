"""vLLM/SGLang converters (issue 30): a benchmark file whose values the ground truth cannot hold is
refused in one line naming the file, key and entry, never truncated, clamped or dropped; an
earlier conversion in the output folder is kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.validation.convert import main
from tests.badinput.refusal import assert_refused


def vllm_result(**overrides: Any) -> dict[str, Any]:
    """Two requests, streamed token by token (vLLM --save-detailed keys)."""
    result: dict[str, Any] = {
        "request_rate": 2.0,
        "input_lens": [100, 200],
        "output_lens": [3, 1],
        "ttfts": [0.1, 0.25],
        "itls": [[0.02, 0.03], []],
        "latencies": [0.15, 0.25],
        "start_times": [1000.5, 1001.0],
        "errors": ["", ""],
    }
    result.update(overrides)
    return result


# (case, overrides or raw text, what the line names)
CASES: list[tuple[str, Any, str]] = [
    ("fractional input length", {"input_lens": [100.5, 200]}, "'input_lens' entry 0"),
    ("fractional output length", {"output_lens": [3, 1.5]}, "'output_lens' entry 1"),
    ("negative output length", {"output_lens": [-3, 1]}, "'output_lens' entry 0"),
    ("huge input length", {"input_lens": [2**70, 200]}, "'input_lens' entry 0"),
    ("input length 1e300", {"input_lens": [1e300, 200]}, "'input_lens' entry 0"),
    ("end before first token", {"latencies": [0.15, 0.1]}, "'latencies' entry 1"),
    ("negative ttft", {"ttfts": [-0.1, 0.25]}, "'ttfts' entry 0"),
    ("zero ttft of a success", {"ttfts": [0.0, 0.25]}, "'ttfts' entry 0"),
    ("negative itl gap", {"itls": [[0.02, -0.03], []]}, "'itls' entry 0"),
    ("string ttft", {"ttfts": ["0.1", 0.25]}, "'ttfts' entry 0"),
    ("bool length", {"input_lens": [True, 200]}, "'input_lens' entry 0"),
    ("error not a string", {"errors": [5, ""]}, "'errors' entry 0"),
    ("itls entry not a list", {"itls": [0.02, []]}, "'itls' entry 0"),
    ("huge start time", {"start_times": [2**80, 1001.0]}, "'start_times' entry 0"),
    (
        "NaN ttft",
        '{"request_rate":"inf","input_lens":[1],"output_lens":[1],"ttfts":[NaN],"itls":[[]]}',
        "'ttfts'",
    ),
    (
        "Infinity latency",
        json.dumps(vllm_result(latencies="X")).replace('"X"', "[0.15, Infinity]"),
        "'latencies'",
    ),
    ("duplicated key", '{"input_lens":[1],"input_lens":[2]}', "'input_lens' given twice"),
    ("truncated JSON", '{"input_lens": [1, 2', "line 1"),
    ("JSON list", "[1, 2]", "one JSON object"),
    ("not UTF-8", b"\xff\xfe{}", "not UTF-8"),
]


@pytest.mark.parametrize(("case", "content", "named"), CASES, ids=[c[0] for c in CASES])
def test_vllm_value_refused_in_one_line_and_earlier_output_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: Any, named: str
) -> None:
    out = tmp_path / "gt"
    good = tmp_path / "good.json"
    good.write_text(json.dumps(vllm_result()))
    assert main(["vllm", str(good), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    src = tmp_path / "bad.json"
    if isinstance(content, bytes):
        src.write_bytes(content)
    else:
        src.write_text(content if isinstance(content, str) else json.dumps(vllm_result(**content)))
    capsys.readouterr()
    assert_refused(main, ["vllm", str(src), str(out)], capsys, "bad.json", named)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sglang_run_with_bad_value_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = vllm_result(output_lens=[3.5, 1])
    del run["start_times"]
    src = tmp_path / "runs.jsonl"
    src.write_text(json.dumps(run | {"request_rate": "inf"}) + "\n")
    assert_refused(
        main, ["sglang", str(src), str(tmp_path / "gt")], capsys, "'output_lens' entry 0"
    )


@pytest.mark.parametrize(
    ("case", "content"),
    [("not a list", '{"a": 1}'), ("a string time", '[0, "1"]'), ("negative", "[0, -1]")],
)
def test_bad_send_times_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: str
) -> None:
    run = vllm_result()
    del run["start_times"]
    src, times = tmp_path / "r.json", tmp_path / "times.json"
    src.write_text(json.dumps(run))
    times.write_text(content)
    argv = ["vllm", str(src), str(tmp_path / "gt"), "--send-times", str(times)]
    assert_refused(main, argv, capsys, "times.json")


def test_output_path_that_is_a_file_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = tmp_path / "r.json", tmp_path / "gt"
    src.write_text(json.dumps(vllm_result()))
    out.write_text("keep me")
    assert_refused(main, ["vllm", str(src), str(out)], capsys, str(out), "not a folder")
    assert out.read_text() == "keep me"
