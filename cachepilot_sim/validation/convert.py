"""Convert vLLM and SGLang benchmark output into ground-truth folders (docs/validation.md).

Field names come from the tools' own sources:
- vLLM, `vllm bench serve --save-result --save-detailed`: one JSON object whose per-request lists
  are `input_lens`, `output_lens`, `ttfts` (s), `itls` (per request, the gaps between streamed
  chunks, s), `start_times` (client perf_counter, s), `latencies` (s) and `errors` ("" on
  success). vllm-project/vllm, vllm/benchmarks/serve.py at 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1:
  the `result` dict of `benchmark()`, which `main_async()` strips unless --save-detailed.
- SGLang, `python -m sglang.bench_serving --output-file F.jsonl --output-details`: appends one JSON
  object per run (one line), whose per-request lists are `input_lens`, `output_lens`, `ttfts`,
  `itls` and `errors`; it records no send times. sgl-project/sglang, python/sglang/bench_serving.py
  at 0033168f0f58b2bc05aa0273bd475d9c01bafb1c: `result_details` in `benchmark()`.

Send times: `start_times` when the file has them, else times the caller passes, else 0 for every
request when the run was a closed batch (`request_rate` inf); otherwise the conversion fails, since
replaying an open-loop run without its arrival times would validate against the wrong load.
Per-token times exist only when every streamed chunk held one token (len(itl) == output - 1).

    python -m cachepilot_sim.validation.convert vllm RESULT.json OUT_DIR
    python -m cachepilot_sim.validation.convert sglang RUNS.jsonl OUT_DIR --line -1
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.entry import entry_point
from cachepilot_sim.inputs import InputError, parse_json, read_text
from cachepilot_sim.outputs import check_folder, finite_or_none, staged_folder
from cachepilot_sim.validation.ground_truth import (
    ENGINE_FILE,
    REQUESTS_FILE,
    GroundTruthError,
    load_ground_truth,
)

REQUEST_SCHEMA = pl.Schema(
    {
        "request_id": pl.String(),
        "send_us": pl.Int64(),
        "prompt_tokens": pl.Int64(),
        "output_tokens": pl.Int64(),
        "first_token_us": pl.Int64(),
        "end_us": pl.Int64(),
        "token_us": pl.List(pl.Int64),
        "status": pl.String(),
        "error": pl.String(),
    }
)
_REQUIRED = ("input_lens", "output_lens", "ttfts", "itls")
_METADATA = ("date", "backend", "model_id", "label", "request_rate", "burstiness",
             "max_concurrency", "num_prompts", "dataset_name")  # fmt: skip


MAX_TOKENS = 2**31 - 1  # as the trace readers bound a length (workloads/traces.py)
MAX_SECONDS = 2**61 / 1e6  # a time in µs must fit int64 with room for sums


class ConvertError(InputError):
    """Benchmark output that cannot be converted; the message names the file and the key."""


def _number(path: Path, key: str, i: int, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise ConvertError(f"{path}: key '{key}' entry {i} is not a finite number ({value!r})")
    return float(value)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value) and abs(value) <= MAX_SECONDS
    except OverflowError:  # an int beyond a float
        return False


def _seconds(path: Path, key: str, i: int, value: Any) -> float:
    """A time in seconds: finite and >= 0."""
    number = _number(path, key, i, value)
    if number < 0:
        raise ConvertError(f"{path}: key '{key}' entry {i} is negative ({value!r} s)")
    return number


def _count(path: Path, key: str, i: int, value: Any) -> int:
    """A token count: an integer in 0..MAX_TOKENS (a fraction is refused, not truncated)."""
    number = _number(path, key, i, value)
    if not number.is_integer() or not 0 <= number <= MAX_TOKENS:
        raise ConvertError(
            f"{path}: key '{key}' entry {i} = {value!r}: must be a whole number of tokens in "
            f"0..{MAX_TOKENS}"
        )
    return int(number)


def _lists(path: Path, result: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-request lists, checked for presence, type and equal length."""
    for key in _REQUIRED:
        if key not in result:
            raise ConvertError(
                f"{path}: missing key '{key}' (save per-request details: vLLM --save-detailed, "
                "SGLang --output-details)"
            )
    lists = {
        k: result[k] for k in (*_REQUIRED, "start_times", "latencies", "errors") if k in result
    }
    for key, value in lists.items():
        if not isinstance(value, list):
            raise ConvertError(f"{path}: key '{key}' is not a list")
    n = len(lists["input_lens"])
    for key, value in lists.items():
        if len(value) != n:
            raise ConvertError(
                f"{path}: key '{key}' has {len(value)} entries, 'input_lens' has {n}"
            )
    if n == 0:
        raise ConvertError(f"{path}: key 'input_lens' is empty")
    return lists


def _send_times_s(
    path: Path, result: dict[str, Any], lists: dict[str, list[Any]], given: Sequence[float] | None
) -> tuple[list[float], str]:
    n = len(lists["input_lens"])
    if "start_times" in lists:
        starts = [_number(path, "start_times", i, v) for i, v in enumerate(lists["start_times"])]
        return [t - min(starts) for t in starts], "start_times"
    if given is not None:
        if len(given) != n:
            raise ConvertError(f"{path}: {len(given)} send times given for {n} requests")
        return [float(t) - min(given) for t in given], "given"
    rate = result.get("request_rate")
    if rate in ("inf", float("inf")) or (isinstance(rate, str) and rate.lower() == "inf"):
        return [0.0] * n, "closed batch (request_rate inf)"
    raise ConvertError(
        f"{path}: key 'start_times' is missing and request_rate is {rate!r}: pass the send times "
        "(--send-times), an open-loop run cannot be replayed without them"
    )


def _request_row(path: Path, lists: dict[str, list[Any]], i: int, send_s: float) -> dict[str, Any]:
    error = lists["errors"][i] if "errors" in lists else None
    if error is not None and not isinstance(error, str):
        raise ConvertError(f"{path}: key 'errors' entry {i} is not a string or null ({error!r})")
    prompt = _count(path, "input_lens", i, lists["input_lens"][i])
    output = _count(path, "output_lens", i, lists["output_lens"][i])
    ttft = _number(path, "ttfts", i, lists["ttfts"][i])
    itl = lists["itls"][i]
    if not isinstance(itl, list):
        raise ConvertError(f"{path}: key 'itls' entry {i} is not a list")
    gaps = [_seconds(path, "itls", i, g) for g in itl]
    send_us = round(send_s * 1e6)
    row: dict[str, Any] = {"request_id": f"req-{i:06d}", "send_us": send_us,
                           "prompt_tokens": prompt, "output_tokens": output,
                           "first_token_us": None, "end_us": None, "token_us": None,
                           "status": "failed", "error": error or None}  # fmt: skip
    if error or output < 1:
        return row
    if ttft <= 0:  # a successful request's first token comes after it was sent
        raise ConvertError(
            f"{path}: key 'ttfts' entry {i} = {ttft!r} s for a request without an error: a "
            "successful request's time to first token is > 0"
        )
    first_s = send_s + ttft
    token_us = [round(t * 1e6) for t in accumulate(gaps, initial=first_s)]
    if "latencies" in lists and not gaps:
        latency = _seconds(path, "latencies", i, lists["latencies"][i])
        if latency < ttft:
            raise ConvertError(
                f"{path}: key 'latencies' entry {i} = {latency!r} s ends before the first token "
                f"(ttfts entry {i} = {ttft!r} s)"
            )
        end_us = round((send_s + latency) * 1e6)
    else:
        end_us = token_us[-1]
    row.update(status="finished", first_token_us=token_us[0], end_us=end_us)
    if len(gaps) == output - 1:
        row["token_us"] = token_us
    return row


def _write(
    path: Path, result: dict[str, Any], out_dir: Path, engine: str, given: Sequence[float] | None
) -> Path:
    lists = _lists(path, result)
    send_s, source = _send_times_s(path, result, lists, given)
    rows = [_request_row(path, lists, i, t) for i, t in enumerate(send_s)]
    finished = [r for r in rows if r["status"] == "finished"]
    if any(r["token_us"] is None for r in finished):  # some streamed several tokens per chunk:
        for r in rows:  # no token times at all, rather than ITL over a subset
            r["token_us"] = None
    meta = {k: result[k] for k in _METADATA if k in result}
    engine_json = {"engine": engine, "source_file": str(path), "send_times": source, **meta}
    # Written into a staging folder, checked, then swapped in: a refused conversion leaves an
    # earlier one in `out_dir` as it was.
    with staged_folder(out_dir) as stage:
        pl.DataFrame(rows, schema=REQUEST_SCHEMA).write_parquet(stage / REQUESTS_FILE)
        text = json.dumps(finite_or_none(engine_json), indent=1, default=str)
        (stage / ENGINE_FILE).write_text(text)
        try:
            load_ground_truth(stage)  # the converter's output obeys the same rules as captures
        except GroundTruthError as err:
            raise ConvertError(f"{path}: converted ground truth is invalid: {err}") from err
    return out_dir


def _read_json(path: Path) -> Any:
    """The benchmark's JSON: a key given twice is refused (which one would count?); NaN is read
    (the tools write it for an empty statistic) and refused only where a value is used."""
    return parse_json(read_text(path, "benchmark output"), path, allow_nan=True)


def _send_times_file(path: Path) -> list[float]:
    given = _read_json(path)
    if not isinstance(given, list) or not given:
        raise ConvertError(f"{path}: expected a JSON list of send times in seconds")
    return [_seconds(path, "send times", i, v) for i, v in enumerate(given)]


def vllm_to_ground_truth(
    path: str | Path, out_dir: str | Path, send_times_s: Sequence[float] | None = None
) -> Path:
    """Write the ground-truth folder `out_dir` from a `vllm bench serve --save-detailed` JSON."""
    path = Path(path)
    result = _read_json(path)
    if not isinstance(result, dict):
        raise ConvertError(f"{path}: expected one JSON object (vllm bench serve --save-result)")
    return _write(path, result, Path(out_dir), "vllm", send_times_s)


def sglang_to_ground_truth(
    path: str | Path,
    out_dir: str | Path,
    line: int = -1,
    send_times_s: Sequence[float] | None = None,
) -> Path:
    """Write `out_dir` from run `line` (default: the last) of a `sglang.bench_serving` JSONL."""
    path = Path(path)
    lines = [ln for ln in read_text(path, "benchmark output").splitlines() if ln.strip()]
    if not lines:
        raise ConvertError(f"{path}: no runs (empty file)")
    if not -len(lines) <= line < len(lines):
        raise ConvertError(f"{path}: line {line} out of range ({len(lines)} runs)")
    try:
        result = parse_json(lines[line], path, allow_nan=True)
    except InputError as err:
        reason = str(err).removeprefix(f"{path}: ")
        raise ConvertError(f"{path}: run {line} is not valid JSON ({reason})") from None
    if not isinstance(result, dict):
        raise ConvertError(f"{path}: run {line} is not a JSON object")
    return _write(path, result, Path(out_dir), "sglang", send_times_s)


@entry_point("cachepilot_sim.validation.convert")
def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Convert benchmark output to a ground-truth folder.")
    ap.add_argument("format", choices=["vllm", "sglang"])
    ap.add_argument("source", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--line", type=int, default=-1, help="SGLang JSONL: which run (default last)")
    ap.add_argument("--send-times", type=Path, help="JSON list of send times in seconds")
    args = ap.parse_args(argv)
    given = None if args.send_times is None else _send_times_file(args.send_times)
    check_folder(args.out_dir)
    if args.format == "vllm":
        out = vllm_to_ground_truth(args.source, args.out_dir, given)
    else:
        out = sglang_to_ground_truth(args.source, args.out_dir, args.line, given)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
