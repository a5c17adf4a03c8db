"""`python -m cachepilot_sim.validate` and the ground-truth replay (validation/replay.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.tools.validate import main, validate_runs
from cachepilot_sim.validation.block_hashes import replay_hash_ids
from cachepilot_sim.validation.ground_truth import load_ground_truth
from cachepilot_sim.validation.replay import replay_order

ROOT = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01"


def test_a_turn_shares_its_parents_full_blocks_including_one_its_reply_filled() -> None:
    ids = replay_hash_ids([600, 900, 300, 700], [100, 10, 5, 5], [-1, 0, -1, 2], 256)
    assert ids[0] == [0, 1, 2]
    assert ids[1][:2] == ids[0][:2] and ids[1][2] not in ids[0]  # 610 // 256 = 2 shared
    assert len(ids[1]) == 4 and not set(ids[2]) & set(ids[0] + ids[1])
    assert ids[3][:1] == ids[2][:1] and len(set(ids[3]) & set(ids[2])) == 1  # 305 // 256 = 1
    ids = replay_hash_ids([600, 900], [200, 10], [-1, 0], 256)
    assert ids[1][:3] == ids[0]  # 800 // 256 = 3: the partial block was filled by the reply


def test_replay_order_sends_turns_after_their_parent_with_its_think_time() -> None:
    order = replay_order(load_ground_truth(ROOT / "multiturn/run1"))
    turns = order.filter(pl.col("parent_row") >= 0)
    assert turns.height == 72
    assert (turns["parent_row"] < turns["row"].cast(pl.Int64)).all()
    assert (turns["think_us"] >= 0).all()


def test_bad_ground_truth_exits_2_naming_file_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "broken" / "run1"
    shutil.copytree(ROOT / "closed_b16/run1", run)
    pl.read_parquet(run / "requests.parquet").drop("end_us").write_parquet(run / "requests.parquet")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "requests.parquet" in err and "'end_us'" in err


@pytest.mark.parametrize("engine", ["hf_cb", "vllm_v1"])
def test_every_engine_profile_replays_a_run_to_completion(engine: str) -> None:
    out, pairs = validate_runs(ROOT / "closed_b16", engine)
    row = out["closed_b16"]
    assert row["finished_sim"] == row["requests"] == 16
    sim, _ = pairs["closed_b16"]
    assert sim.finished.height == 16
