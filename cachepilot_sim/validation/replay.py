"""Replay a ground-truth run through the simulator: the exact request list, the engine's profile.

Requests without a parent are sent at their recorded send time; a request with a parent (a later
turn) is sent its think time after the parent's last token in the simulation, as the capture's
client did. Blocks are shared by the ground truth's `block_hash_ids` when it has them (a system
prompt shared across sessions), else along parent chains (a turn's prompt extends its parent's
prompt and reply); either way a request also shares the blocks its reply filled, as the engine
does (`block_hashes.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config import RunConfig, SimConfig
from cachepilot_sim.validation.block_hashes import (
    SharedBlocksRule,
    num_shared_blocks,
    replay_hash_ids,
)
from cachepilot_sim.validation.engine_settings import resolve
from cachepilot_sim.validation.ground_truth import (
    ENGINE_FILE,
    HASH_COLUMN,
    GroundTruth,
    GroundTruthError,
)
from cachepilot_sim.workloads.replay import ReplayWorkload
from cachepilot_sim.workloads.sessions import Sessions
from cachepilot_sim.workloads.traces import TraceTable


def replay_order(gt: GroundTruth) -> pl.DataFrame:
    """The requests in send order (ties by id), with their parent's row index (-1: none)."""
    df = gt.requests.sort("send_us", "request_id").with_row_index("row")
    if "parent_id" not in df.columns:
        return df.with_columns(parent_row=pl.lit(-1, pl.Int64), think_us=pl.lit(-1, pl.Int64))
    rows = dict(zip(df["request_id"].to_list(), df["row"].to_list(), strict=True))
    parent = [rows.get(p, -1) if p is not None else -1 for p in df["parent_id"].to_list()]
    think = df["think_time_us"] if "think_time_us" in df.columns else pl.Series([0] * df.height)
    return df.with_columns(
        parent_row=pl.Series(parent, dtype=pl.Int64),
        think_us=pl.when(pl.Series(parent) >= 0).then(think.fill_null(0)).otherwise(-1),
    )


def workload_from_ground_truth(
    gt: GroundTruth, block_tokens: int, rule: SharedBlocksRule = num_shared_blocks
) -> tuple[ReplayWorkload, pl.DataFrame]:
    """The ReplayWorkload of `gt` (rows in send order) and that order's request frame; `rule`
    says how many blocks of prompt + reply a request shares (the engine's by default)."""
    df = replay_order(gt)
    prompt = df["prompt_tokens"].to_list()
    parent = df["parent_row"].to_list()
    column = None
    if HASH_COLUMN in df.columns:
        size = gt.engine.get("block_size")
        if size != block_tokens:
            raise GroundTruthError(
                f"{gt.path / ENGINE_FILE}: key 'block_size' ({size}) is not the replay's "
                f"{block_tokens}-token hash block, so column '{HASH_COLUMN}' cannot be replayed "
                "(set replay.hash_block_tokens to it)"
            )
        column = df[HASH_COLUMN].to_list()
    output = (
        df["output_tokens"]
        .fill_null(df["max_new_tokens"] if "max_new_tokens" in df.columns else 1)
        .to_numpy()
        .astype(np.int64)
    )
    ids = replay_hash_ids(prompt, output.tolist(), parent, block_tokens, column, rule)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in ids])
    n = df.height
    table = TraceTable(
        str(gt.path),
        np.arange(1, n + 1),
        df["send_us"].to_numpy().astype(np.int64),
        np.asarray(prompt, dtype=np.int64),
        np.maximum(output, 1),
        offsets,
        np.fromiter((h for x in ids for h in x), dtype=np.int64, count=int(offsets[-1])),
    )
    parents = np.asarray(parent, dtype=np.int64)
    session = np.arange(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    for i in range(n):  # parents come first in send order
        if parents[i] >= 0:
            session[i], turn[i] = session[parents[i]], turn[parents[i]] + 1
    sessions = Sessions(parents, session, turn, int(np.unique(session).size))
    workload = ReplayWorkload(table, table.arrival_us, sessions, df["think_us"].to_numpy())
    return workload, df


def engine_overrides(gt: GroundTruth, profile: RunConfig) -> list[str]:
    """Config overrides from the run's engine.json for a replay on `profile` (every setting
    honoured or refused: validation/engine_settings.py)."""
    return resolve(Path(gt.path), gt.engine, profile).overrides


def simulate(
    cfg: SimConfig, gt: GroundTruth, rule: SharedBlocksRule = num_shared_blocks
) -> tuple[GroundTruth, dict[str, Any]]:
    """Run `gt`'s request list through the simulator; the result in the ground-truth shape (so
    the same metrics apply, with each request's `prefix_hit_tokens`) and the simulator's run
    metrics. `rule`: as in `workload_from_ground_truth`."""
    from cachepilot_sim.sim import build  # the core, imported only when a replay runs

    workload, order = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens, rule)
    simulation = build(cfg, None, workload)
    result = simulation.run()
    gaps = simulation.batcher.stats.itl_gaps  # every token after a request's first: exact
    itl = np.repeat(np.fromiter(gaps, np.int64, len(gaps)), list(gaps.values()))
    sim = result.requests.sort("request")
    # Not in the request log (its schema is every run's): read off the requests themselves.
    hits = {
        r.req_id: r.prefix_hit_tokens for r in simulation.clients.requests if r.admitted_us >= 0
    }
    sim = sim.with_columns(
        prefix_hit_tokens=pl.Series([hits.get(i) for i in sim["request"].to_list()], dtype=pl.Int64)
    )
    done = pl.col("outcome") == "completed"
    frame = sim.select(
        request_id=order["request_id"],
        send_us=pl.col("arrival_us"),
        prompt_tokens=order["prompt_tokens"],
        output_tokens=pl.col("generated"),
        first_token_us=pl.when(done).then(pl.col("first_token_us")),
        end_us=pl.when(done).then(pl.col("finish_us")),
        status=pl.when(done).then(pl.lit("finished")).otherwise(pl.lit("failed")),
        # A preemption is a CPU swap (KV kept in the engine's swap space) or a soft reset.
        num_soft_resets=pl.col("preemptions") - pl.col("cpu_swaps"),
        num_cpu_swaps=pl.col("cpu_swaps"),
        prefix_hit_tokens=pl.col("prefix_hit_tokens"),
    )
    out = GroundTruth(Path(gt.path), frame, None, {"engine": "cachepilot-sim"}, pl.Series(itl))
    return out, result.metrics
