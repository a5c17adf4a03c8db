"""Converters: hand-made files with the fields `vllm bench serve --save-detailed` and
`sglang.bench_serving --output-details` write become valid ground-truth folders with the right
times; bad files stop with one line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.validation.convert import (
    ConvertError,
    main,
    sglang_to_ground_truth,
    vllm_to_ground_truth,
)
from cachepilot_sim.validation.ground_truth import load_ground_truth
from cachepilot_sim.validation.gt_stats import summarize


def make_vllm(**overrides: Any) -> dict[str, Any]:
    """Three requests: two streamed token by token, one failed (vLLM's result keys)."""
    result: dict[str, Any] = {
        "date": "20261201-120000",
        "backend": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B",
        "request_rate": 2.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 3.0,
        "completed": 2,
        "input_lens": [100, 200, 50],
        "output_lens": [3, 2, 0],
        "ttfts": [0.1, 0.25, 0.0],
        "itls": [[0.02, 0.03], [0.04], []],
        "latencies": [0.15, 0.29, 0.0],
        "start_times": [1000.5, 1001.0, 1001.2],
        "generated_texts": ["a b c", "d e", ""],
        "errors": ["", "", "Bad Request"],
        "mean_ttft_ms": 175.0,
    }
    result.update(overrides)
    return result


def write(path: Path, obj: Any) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def test_vllm_detailed_result_becomes_ground_truth_with_client_times(tmp_path: Path) -> None:
    out = vllm_to_ground_truth(write(tmp_path / "r.json", make_vllm()), tmp_path / "gt")
    gt = load_ground_truth(out)
    req = gt.requests.sort("request_id")
    assert req["status"].to_list() == ["finished", "finished", "failed"]
    assert req["send_us"].to_list() == [0, 500_000, 700_000]
    assert req["first_token_us"].to_list()[:2] == [100_000, 750_000]
    assert req["token_us"].to_list()[:2] == [[100_000, 120_000, 150_000], [750_000, 790_000]]
    assert req["end_us"].to_list()[:2] == [150_000, 790_000]
    assert gt.engine["engine"] == "vllm" and gt.engine["send_times"] == "start_times"
    assert gt.engine["model_id"] == "meta-llama/Llama-3.1-8B"
    s = summarize(gt)
    assert s["ttft_ms_mean"] == pytest.approx(175.0)  # what vllm itself reported
    assert (s["finished"], s["failed"]) == (2, 1)


def test_multi_token_chunks_keep_ttft_and_end_but_drop_token_times(tmp_path: Path) -> None:
    # request 0 streamed 3 tokens in 2 chunks: one gap, not two
    result = make_vllm(itls=[[0.05], [0.04], []])
    gt = load_ground_truth(vllm_to_ground_truth(write(tmp_path / "r.json", result), tmp_path / "g"))
    first = gt.requests.sort("request_id").row(0, named=True)
    assert first["token_us"] is None and first["end_us"] == 150_000
    assert summarize(gt)["tpot_ms_mean"] == pytest.approx((25.0 + 40.0) / 2)


def test_closed_batch_without_start_times_sends_everything_at_zero(tmp_path: Path) -> None:
    result = make_vllm(request_rate="inf")
    del result["start_times"]
    gt = load_ground_truth(vllm_to_ground_truth(write(tmp_path / "r.json", result), tmp_path / "g"))
    assert gt.requests["send_us"].to_list() == [0, 0, 0]
    assert gt.engine["send_times"] == "closed batch (request_rate inf)"


def test_open_loop_run_without_send_times_is_refused_unless_they_are_given(tmp_path: Path) -> None:
    result = make_vllm()
    del result["start_times"]
    src = write(tmp_path / "r.json", result)
    with pytest.raises(ConvertError, match=r"r\.json: key 'start_times' is missing"):
        vllm_to_ground_truth(src, tmp_path / "g")
    gt = load_ground_truth(vllm_to_ground_truth(src, tmp_path / "g", send_times_s=[3, 4, 5]))
    assert gt.requests["send_us"].to_list() == [0, 1_000_000, 2_000_000]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ttfts": None}, "key 'ttfts' is not a list"),
        ({"output_lens": [3, 2]}, "key 'output_lens' has 2 entries, 'input_lens' has 3"),
        ({"ttfts": [0.1, "x", 0.0]}, "key 'ttfts' entry 1 is not a finite number"),
        ({"itls": [[0.02, float("nan")], [0.04], []]}, "key 'itls' entry 0 is not a finite"),
        ({"itls": [[0.02], 0.04, []]}, "key 'itls' entry 1 is not a list"),
    ],
)
def test_bad_vllm_key_is_named_with_its_file(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    src = write(tmp_path / "r.json", json.dumps(make_vllm(**overrides)))
    with pytest.raises(ConvertError) as err:
        vllm_to_ground_truth(src, tmp_path / "g")
    assert str(src) in str(err.value) and message in str(err.value)


def test_vllm_result_saved_without_details_names_the_flag(tmp_path: Path) -> None:
    result = {k: v for k, v in make_vllm().items() if k not in ("ttfts", "itls")}
    with pytest.raises(ConvertError, match="missing key 'ttfts'.*--save-detailed"):
        vllm_to_ground_truth(write(tmp_path / "r.json", result), tmp_path / "g")


def make_sglang_run(**overrides: Any) -> dict[str, Any]:
    """One `sglang.bench_serving --output-details` line: result keys plus result_details."""
    run: dict[str, Any] = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": float("inf"),
        "max_concurrency": None,
        "completed": 2,
        "mean_ttft_ms": 60.0,
        "input_lens": [64, 128],
        "output_lens": [2, 3],
        "ttfts": [0.05, 0.07],
        "itls": [[0.01], [0.01, 0.02]],
        "generated_texts": ["x y", "x y z"],
        "errors": ["", ""],
    }
    run.update(overrides)
    return run


def test_sglang_jsonl_converts_the_chosen_run(tmp_path: Path) -> None:
    lines = [json.dumps(make_sglang_run()), json.dumps(make_sglang_run(ttfts=[0.5, 0.6]))]
    src = write(tmp_path / "runs.jsonl", "\n".join(lines) + "\n")
    last = load_ground_truth(sglang_to_ground_truth(src, tmp_path / "last"))
    first = load_ground_truth(sglang_to_ground_truth(src, tmp_path / "first", line=0))
    assert last.requests["first_token_us"].to_list() == [500_000, 600_000]
    assert first.requests["token_us"].to_list() == [[50_000, 60_000], [70_000, 80_000, 100_000]]
    assert first.engine["engine"] == "sglang" and first.engine["dataset_name"] == "random"
    assert summarize(first)["ttft_ms_mean"] == pytest.approx(60.0)


def test_sglang_open_loop_run_needs_send_times(tmp_path: Path) -> None:
    src = write(tmp_path / "runs.jsonl", json.dumps(make_sglang_run(request_rate=4.0)))
    with pytest.raises(ConvertError, match=r"runs\.jsonl: key 'start_times' is missing"):
        sglang_to_ground_truth(src, tmp_path / "g")
    gt = load_ground_truth(sglang_to_ground_truth(src, tmp_path / "g", send_times_s=[0.0, 0.25]))
    assert gt.requests["send_us"].to_list() == [0, 250_000]


def test_bad_sglang_files_are_named(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.jsonl", "\n")
    with pytest.raises(ConvertError, match=r"empty\.jsonl: no runs"):
        sglang_to_ground_truth(empty, tmp_path / "g")
    broken = write(tmp_path / "broken.jsonl", '{"input_lens": [1]\n')
    with pytest.raises(ConvertError, match=r"broken\.jsonl: run -1 is not valid JSON"):
        sglang_to_ground_truth(broken, tmp_path / "g")
    one = write(tmp_path / "one.jsonl", json.dumps(make_sglang_run()))
    with pytest.raises(ConvertError, match=r"one\.jsonl: line 3 out of range \(1 runs\)"):
        sglang_to_ground_truth(one, tmp_path / "g", line=3)


def test_command_line_prints_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "r.json", make_vllm())
    main(["vllm", str(src), str(tmp_path / "ok")])
    assert "wrote" in capsys.readouterr().out
    assert main(["vllm", str(tmp_path / "absent.json"), str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "absent.json" in err and "Traceback" not in err
