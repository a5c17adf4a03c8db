"""Block sharing of a ground-truth replay (validation/block_hashes.py): the engine's registration
rule against the engine's own log, reply-filled blocks shared along parent chains and by
`block_hash_ids`, and a shared system prompt that only the column can express."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.block_hashes import (
    SharedBlocksRule,
    num_prompt_blocks_only,
    num_shared_blocks,
    replay_hash_ids,
)
from cachepilot_sim.validation.ground_truth import GroundTruth, load_ground_truth
from cachepilot_sim.validation.prefix_hits import compare_prefix_hits
from cachepilot_sim.validation.replay import engine_overrides, simulate

ROOT = Path(__file__).resolve().parents[2]
MULTITURN = ROOT / "experiments/validation/hf_cb/2026-12-01/multiturn"
SHARED_PROMPT = ROOT / "tests/data/ground_truth_shared_prompt/run1"


def _replay(gt: GroundTruth, rule: SharedBlocksRule = num_shared_blocks) -> GroundTruth:
    run_cfg = sim_config("hf_cb", engine_overrides(gt, sim_config("hf_cb", [])))
    sim, _ = simulate(run_cfg.sim_for(run_cfg.policy.name, 0), gt, rule)
    return sim


def test_rule_matches_every_registration_in_the_engines_hash_log() -> None:
    """hashdiag.jsonl.gz logs each request's prefix match and each block the engine hashed: a
    request's own hits plus the blocks it marked are what the rule says, for all 96 requests;
    the opposite rule (decode-filled blocks never shared) misses most of them."""
    with gzip.open(MULTITURN / "hashdiag.jsonl.gz", "rt") as f:
        events = [json.loads(line) for line in f]
    marked: Counter[str] = Counter()
    for e in events:
        if e["ev"] == "hash":
            marked[e["rid"]] += e["n"]
    hits = {e["rid"]: e["hit"] for e in events if e["ev"] == "search"}
    real = {rid: hits[rid] + marked[rid] for rid in hits}  # blocks hashed when it ended
    df = pl.read_parquet(MULTITURN / "run1/requests.parquet")
    lengths = list(zip(df["request_id"], df["prompt_tokens"], df["output_tokens"], strict=True))
    assert len(lengths) == len(real) == 96
    assert all(real[rid] == num_shared_blocks(p, o, 256) for rid, p, o in lengths)
    missed = sum(real[rid] != num_prompt_blocks_only(p, o, 256) for rid, p, o in lengths)
    assert missed > 48


def test_the_last_step_and_the_last_token_fill_no_shared_block() -> None:
    # KV of 510 + 2 - 2 = 510 tokens when the last marked step ends: one full block
    assert num_shared_blocks(510, 2, 256) == 1
    assert num_shared_blocks(510, 4, 256) == 2  # 512 tokens after the third token's step
    assert num_shared_blocks(512, 1, 256) == 2  # the prompt's full blocks at least


def test_a_turn_shares_blocks_made_of_its_parents_reply_only() -> None:
    ids = replay_hash_ids([100, 1200], [700, 10], [-1, 0], 256)
    # the parent shares (100 + 700 - 2) // 256 = 3 blocks, two of them reply only
    assert len(ids[0]) == 3 and ids[1][:3] == ids[0]
    prompt_only = replay_hash_ids(
        [100, 1200], [700, 10], [-1, 0], 256, None, num_prompt_blocks_only
    )
    assert not set(prompt_only[1]) & set(prompt_only[0])


def test_the_column_names_full_blocks_and_a_childs_names_the_reply_blocks() -> None:
    parent = [11, 12]  # 300 tokens: one full block, a partial one (never shared as such)
    child = [11, 22, 23, 24]  # 300 + 250 + 250 tokens: its block 1 ends in the parent's reply
    ids = replay_hash_ids([300, 800], [250, 5], [-1, 0], 256, [parent, child])
    assert ids[1][:2] == ids[0][:2]  # (300 + 250 - 2) // 256 = 2 blocks shared
    assert len(set(ids[1])) == 4
    short = replay_hash_ids([300, 800], [200, 5], [-1, 0], 256, [parent, [11, 22, 23, 24]])
    assert short[1][0] == short[0][0] and short[1][1] != short[0][1]  # 498 // 256 = 1
    unrelated = replay_hash_ids([300, 300], [5, 5], [-1, -1], 256, [[11, 12], [11, 12]])
    assert unrelated[0][0] == unrelated[1][0] and unrelated[0][1] != unrelated[1][1]


def test_multiturn_replay_hits_what_the_engine_hit_and_the_opposite_rule_does_not() -> None:
    real = load_ground_truth(MULTITURN / "run1")
    exact = compare_prefix_hits(_replay(real), real)
    assert exact["real_hit_tokens"] == exact["sim_hit_tokens"] == 62720
    assert exact["exact_fraction"] == 1.0
    opposite = compare_prefix_hits(_replay(real, num_prompt_blocks_only), real)
    assert opposite["hit_tokens_err"] == pytest.approx(-0.18, abs=0.01)
    assert opposite["exact_fraction"] < 0.6


def test_a_system_prompt_shared_across_sessions_is_shared_only_with_the_column() -> None:
    real = load_ground_truth(SHARED_PROMPT)
    assert "parent_id" not in real.requests.columns
    sim = _replay(real)
    assert sim.requests["prefix_hit_tokens"].to_list() == [0, 256, 256, 256]
    assert compare_prefix_hits(sim, real)["exact_fraction"] == 1.0
    without = GroundTruth(real.path, real.requests.drop("block_hash_ids"), None, real.engine)
    assert _replay(without).requests["prefix_hit_tokens"].sum() == 0
