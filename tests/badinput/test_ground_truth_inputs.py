"""Ground truth is checked completely (issue 30): every engine.json setting the replay uses is
typed and ranged (null, another type, a huge number refused, never dropped to "size from
vram_gb"), every token-time list complete, every parent present and earlier, no count negative,
and a run that validates nothing is an error; each refusal is one line naming file and key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.tools.validate import main, sim_config
from cachepilot_sim.validation.engine_settings import EngineSettingsError, resolve
from cachepilot_sim.validation.ground_truth import GroundTruthError, load_ground_truth
from tests.badinput.refusal import assert_refused

ROOT = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01"
CAPTURE = ROOT / "closed_b16/run1"


@pytest.fixture(scope="module")
def hf_cb() -> Any:
    return sim_config("hf_cb", [])


def _engine(**changes: Any) -> dict[str, Any]:
    return json.loads((CAPTURE / "engine.json").read_text()) | changes


SETTINGS: list[tuple[str, Any]] = [
    ("num_blocks", None),
    ("block_size", None),
    ("max_batch_tokens", None),
    ("safety_margin", None),
    ("use_async_batching", None),
    ("num_blocks", 2**70),
    ("max_batch_tokens", 2**40),
    ("max_requests_per_batch", 10**12),
    ("num_cpu_blocks", 2**63),
    ("kv_bytes_per_token", 2**64),
    ("gpu", 5),
    ("gpu", None),
    ("gpu", ""),
    ("gpu", ["NVIDIA H200"]),
]


@pytest.mark.parametrize(("key", "value"), SETTINGS, ids=[f"{k}={v!r}" for k, v in SETTINGS])
def test_engine_setting_null_huge_or_mistyped_is_refused_naming_the_key(
    hf_cb: Any, key: str, value: Any
) -> None:
    with pytest.raises(EngineSettingsError, match=rf"engine\.json: key '{key}'"):
        resolve(CAPTURE, _engine(**{key: value}), hf_cb)


def _requests(**overrides: Any) -> dict[str, list[Any]]:
    """Three finished requests; b continues a's session after 5 ms of thought."""
    cols: dict[str, list[Any]] = {
        "request_id": ["a", "b", "c"],
        "session_id": ["s", "s", None],
        "parent_id": [None, "a", None],
        "send_us": [0, 1_305_000, 500_000],
        "prompt_tokens": [100, 300, 50],
        "output_tokens": [3, 2, 1],
        "first_token_us": [100_000, 1_400_000, 700_000],
        "end_us": [1_300_000, 1_600_000, 700_000],
        "token_us": [[100_000, 700_000, 1_300_000], [1_400_000, 1_600_000], [700_000]],
        "status": ["finished", "finished", "finished"],
        "think_time_us": [None, 5_000, None],
        "num_cpu_swaps": [0, 0, 0],
    }
    cols.update(overrides)
    return cols


def _folder(tmp_path: Path, frame: pl.DataFrame) -> Path:
    folder = tmp_path / "wl" / "run1"
    folder.mkdir(parents=True)
    frame.write_parquet(folder / "requests.parquet")
    (folder / "engine.json").write_text(json.dumps({"engine": "hand-made", "block_size": 16}))
    return folder


ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("empty token list", {"token_us": [[100_000, 700_000, 1_300_000], [], [700_000]]}, "token_us"),
    (
        "null token time",
        {"token_us": [[100_000, None, 1_300_000], [1_400_000, 1_600_000], [700_000]]},
        "token_us",
    ),  # fmt: skip
    (
        "token times for some only",
        {"token_us": [[100_000, 700_000, 1_300_000], None, [700_000]]},
        "token_us",
    ),  # fmt: skip
    ("negative think time", {"think_time_us": [None, -5_000, None]}, "think_time_us"),
    ("negative swaps", {"num_cpu_swaps": [0, -1, 0]}, "num_cpu_swaps"),
    ("parent is itself", {"parent_id": [None, "b", None]}, "parent_id"),
    ("parent sent later", {"parent_id": ["b", None, None]}, "parent_id"),
    (
        "parent sent at the same time",
        {"parent_id": [None, "a", None], "send_us": [0, 0, 500_000]},
        "parent_id",
    ),  # fmt: skip
    ("prompt beyond 2^31", {"prompt_tokens": [2**40, 300, 50]}, "prompt_tokens"),
    ("time beyond 2^61", {"end_us": [2**62, 1_600_000, 700_000]}, "end_us"),
]


@pytest.mark.parametrize(("case", "overrides", "column"), ROWS, ids=[r[0] for r in ROWS])
def test_request_rows_the_replay_cannot_use_are_refused_naming_the_column(
    tmp_path: Path, case: str, overrides: dict[str, Any], column: str
) -> None:
    folder = _folder(tmp_path, pl.DataFrame(_requests(**overrides)))
    with pytest.raises(GroundTruthError, match=rf"requests\.parquet: column '{column}'"):
        load_ground_truth(folder)


def test_unsigned_time_beyond_int64_is_refused_not_a_traceback(tmp_path: Path) -> None:
    frame = pl.DataFrame(_requests()).with_columns(
        pl.Series("end_us", [2**64 - 1, 1_600_000, 700_000], dtype=pl.UInt64)
    )
    with pytest.raises(GroundTruthError, match=r"column 'end_us' holds a value above 2\^63"):
        load_ground_truth(_folder(tmp_path, frame))


def test_duplicated_engine_json_key_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, pl.DataFrame(_requests()))
    (folder / "engine.json").write_text('{"engine": "x", "block_size": 16, "block_size": 32}')
    with pytest.raises(GroundTruthError, match=r"'block_size' given twice"):
        load_ground_truth(folder)


def test_a_run_that_validates_nothing_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(CAPTURE, tmp_path / "microbench" / "run1")
    assert_refused(main, [str(tmp_path)], capsys, "nothing to validate")


def test_unknown_workload_subset_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(CAPTURE, tmp_path / "closed_b16" / "run1")
    argv = [str(tmp_path), "--workloads", "closed_b61"]
    assert_refused(main, argv, capsys, "closed_b61", "closed_b16")


def test_unknown_engine_profile_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(CAPTURE, tmp_path / "closed_b16" / "run1")
    assert_refused(main, [str(tmp_path), "--engine", "nosuch"], capsys, "--engine nosuch")


# An existing --json file is replaced (atomically, outputs.write_text), so it is no refusal.
OUTPUT_STATES = [("--json", "a folder"), ("--json", "under a file"), ("--plot", "a folder"),
                 ("--plot", "under a file"), ("--plot", "a file")]  # fmt: skip


@pytest.mark.parametrize(("option", "state"), OUTPUT_STATES)
def test_unusable_output_path_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, state: str
) -> None:
    shutil.copytree(CAPTURE, tmp_path / "gt" / "closed_b16" / "run1")
    blocker = tmp_path / "out"
    if state == "a folder":
        (blocker / "keep").mkdir(parents=True)
        target = blocker if option == "--json" else blocker / "keep" / "x.txt"
        if option == "--plot":
            target.write_text("keep")
    elif state == "under a file":
        blocker.write_text("keep")
        target = blocker / "sub" / "x"
    else:
        blocker.write_text("keep")
        target = blocker
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert_refused(main, [str(tmp_path / "gt"), option, str(target)], capsys, str(target))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
