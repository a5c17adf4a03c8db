"""fit-engine (issue 30): a steps file that is missing, not Parquet, lacks a column, holds a
string, null, NaN, infinity or a negative value, or leaves no usable step; an argument out of
range; an output path that is a folder: one line naming the file, column or key, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.tools.fit_engine import main
from tests.badinput.refusal import assert_refused

MICRO = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01/microbench"


def _steps(**changes: Any) -> pl.DataFrame:
    steps = pl.read_parquet(MICRO / "steps.parquet").head(40)
    for col, value in changes.items():
        if value is None:
            steps = steps.drop(col)
        else:
            steps = steps.with_columns(pl.Series(col, [value] + steps[col].to_list()[1:]))
    return steps


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing gpu_us", {"gpu_us": None}, "gpu_us"),
    ("missing q_tokens", {"q_tokens": None}, "q_tokens"),
    ("NaN gpu_us", {"gpu_us": math.nan}, "'gpu_us'"),
    ("infinite gpu_us", {"gpu_us": math.inf}, "'gpu_us'"),
    ("negative kv_read_tokens", {"kv_read_tokens": -5}, "'kv_read_tokens'"),
    ("null num_requests", {}, "'num_requests'"),
]


@pytest.mark.parametrize(("case", "changes", "named"), CASES, ids=[c[0] for c in CASES])
def test_bad_steps_file_is_one_line_naming_the_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, changes: dict[str, Any],
    named: str,
) -> None:  # fmt: skip
    path = tmp_path / "steps.parquet"
    if case == "null num_requests":
        steps = _steps().with_columns(
            pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("num_requests"))
            .alias("num_requests")
        )  # fmt: skip
    else:
        steps = _steps(**changes)
    steps.write_parquet(path)
    assert_refused(main, [str(path)], capsys, "steps.parquet", named)


def test_string_column_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "steps.parquet"
    _steps().with_columns(pl.col("gpu_us").cast(pl.String)).write_parquet(path)
    assert_refused(main, [str(path)], capsys, "'gpu_us'", "expected numbers")


@pytest.mark.parametrize(
    ("content", "named"),
    [(None, "file not found"), (b"PAR1 not really", "cannot read as Parquet"), (b"", "Parquet")],
)
def test_missing_or_unreadable_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, named: str
) -> None:
    path = tmp_path / "steps.parquet"
    if content is not None:
        path.write_bytes(content)
    assert_refused(main, [str(path)], capsys, "steps.parquet", named)


def test_no_usable_step_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "steps.parquet"
    _steps().with_columns(graph_captures=pl.lit(1)).write_parquet(path)
    assert_refused(main, [str(path)], capsys, "no usable step")


@pytest.mark.parametrize(
    "argv", [["--q-pad-tokens", "0"], ["--q-shapes", "-1"], ["--max-tokens", "0"]]
)
def test_argument_out_of_range_is_refused_by_argparse(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(MICRO / "steps.parquet"), *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and argv[0] in err and "Traceback" not in err


def test_json_path_that_is_a_folder_is_refused_before_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(main, [str(MICRO / "steps.parquet"), "--json", str(tmp_path)], capsys,
                   str(tmp_path), "is a folder")  # fmt: skip


H100 = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-06-h100"


@pytest.mark.parametrize(
    ("fix", "named"),
    [
        ("bogus=1", "no physical term 'bogus'"),
        ("elementwise_scale", "--fix 'elementwise_scale'"),
        ("elementwise_scale=nan", "--fix 'elementwise_scale=nan'"),
        ("kv_copy_scale=-1", "--fix 'kv_copy_scale=-1'"),
    ],
)
def test_a_bad_held_term_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], fix: str, named: str
) -> None:
    argv = ["--form", "physical", "--gpu-profile", str(H100 / "gpu_profile.json"), "--fix", fix]
    assert_refused(main, [*argv, str(H100 / "microbench_8k/steps.parquet")], capsys, named)


VLLM = Path(__file__).resolve().parents[2] / "experiments/validation/vllm/2026-12-07-h100"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (None, "no microbench.json or engine.json beside it"),
        ({"cudagraph_capture_sizes": "1,2", "cudagraph_mode": "FULL_DECODE_ONLY"},
         "'cudagraph_capture_sizes'"),
        ({"cudagraph_capture_sizes": [1, 2], "cudagraph_mode": "FULL_AND_PIECEWISE"},
         "'cudagraph_mode'"),
    ],
)  # fmt: skip
def test_vllm_steps_without_the_graph_settings_they_were_run_at_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: Any, named: str
) -> None:
    steps = tmp_path / "steps.parquet"
    pl.read_parquet(VLLM / "microbench" / "steps.parquet").write_parquet(steps)
    if settings is not None:
        (tmp_path / "microbench.json").write_text(json.dumps(settings))
    argv = ["--form", "vllm", "--gpu-profile", str(H100 / "gpu_profile.json"), str(steps)]
    assert_refused(main, argv, capsys, named)
