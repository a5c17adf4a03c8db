"""Bad `block_hash_ids` in a ground-truth folder: the loader stops with one line naming the file,
the column and the first bad request; good variants (a partial last block named or not, no ids
for a request never sent) load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.validation.ground_truth import GroundTruthError, load_ground_truth

# prompts of 600, 300 and 256 tokens in 256-token blocks: 2, 1 and 1 full blocks
GOOD_IDS = [[1, 2, 3], [1, 4], [5]]


def write_folder(tmp_path: Path, ids: Any, engine: dict[str, Any] | None = None,
                 status: list[str] | None = None) -> Path:  # fmt: skip
    folder = tmp_path / "shared" / "run1"
    folder.mkdir(parents=True)
    cols: dict[str, Any] = {
        "request_id": ["a", "b", "c"],
        "send_us": [0, 10_000, 20_000],
        "prompt_tokens": [600, 300, 256],
        "output_tokens": [2, 2, 2],
        "first_token_us": [5_000, 15_000, 25_000],
        "end_us": [6_000, 16_000, 26_000],
        "status": status or ["finished"] * 3,
    }
    frame = pl.DataFrame(cols).with_columns(pl.Series("block_hash_ids", ids, strict=False))
    frame.write_parquet(folder / "requests.parquet")
    engine = {"engine": "hand-made", "block_size": 256} if engine is None else engine
    (folder / "engine.json").write_text(json.dumps(engine))
    return folder


@pytest.mark.parametrize(
    ("ids", "row", "reason"),
    [
        ([[1.5, 2.0, 3.0], [1.0, 4.0], [5.0]], None, "expected list of integers"),
        ([["1", "2"], ["1"], ["5"]], None, "expected list of integers"),
        ([[1, 2, 3], [1, None], [5]], "b", "holds a null id"),
        ([[1, 2, 3], None, [5]], "b", "is null for a finished request"),
        ([[1, 2, 3, 9], [1, 4], [5]], "a", "has a length other than prompt_tokens // 256"),
        ([[1], [1, 4], [5]], "a", "has a length other than prompt_tokens // 256"),
        ([[1, 2, 3], [1, 4], [5, 6]], "c", "has a length other than prompt_tokens // 256"),
        ([[1, 1, 3], [1, 4], [5]], "a", "repeats an id within a row"),
        ([[1, 2, 3], [9, 2], [5]], "a", "follows different ids in different rows"),
        ([[1, 2, 3], [1, 4], [2]], "a", "follows different ids in different rows"),
    ],
)  # fmt: skip
def test_bad_block_hash_ids_are_named_with_file_column_and_row(
    tmp_path: Path, ids: Any, row: str | None, reason: str
) -> None:
    folder = write_folder(tmp_path, ids)
    with pytest.raises(GroundTruthError) as err:
        load_ground_truth(folder)
    msg = str(err.value)
    assert str(folder / "requests.parquet") in msg and "'block_hash_ids'" in msg
    assert reason in msg and "\n" not in msg
    if row is not None:
        assert f"(first: '{row}')" in msg


@pytest.mark.parametrize("engine", [{"engine": "x"}, {"engine": "x", "block_size": "256"},
                                    {"engine": "x", "block_size": 0}])  # fmt: skip
def test_block_hash_ids_need_the_engines_block_size(tmp_path: Path, engine: dict[str, Any]) -> None:
    folder = write_folder(tmp_path, GOOD_IDS, engine)
    with pytest.raises(GroundTruthError) as err:
        load_ground_truth(folder)
    msg = str(err.value)
    assert str(folder / "engine.json") in msg and "'block_size'" in msg
    assert "'block_hash_ids'" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("ids", "status"),
    [
        (GOOD_IDS, None),
        ([[1, 2], [1], [5]], None),  # full blocks only
        ([[1, 2, 3], None, [5]], ["finished", "missing", "finished"]),  # b was never sent
    ],
)  # fmt: skip
def test_good_block_hash_ids_load_as_int64_lists(
    tmp_path: Path, ids: Any, status: list[str] | None
) -> None:
    gt = load_ground_truth(write_folder(tmp_path, ids, status=status))
    assert gt.requests.schema["block_hash_ids"] == pl.List(pl.Int64)
