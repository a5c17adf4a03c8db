"""Replay a ground-truth run through the simulator: the exact request list, the engine's profile.

Requests without a parent are sent at their recorded send time; a request with a parent (a later
turn) is sent its think time after the parent's last token in the simulation, as the capture's
client did. A turn's prompt extends its parent's prompt, so its leading full blocks carry the
parent's prefix hashes, the parent's last prompt block included once its reply filled it (the
simulator's prefix-hash path, components/kv/prefix.py); every other block gets a hash of its own.
Blocks made of reply tokens only are not shared in the simulator (its prefix cache keeps prompt
blocks only): no turn of the committed multiturn workload has one (replies are under 256 tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config import RunConfig, SimConfig
from cachepilot_sim.validation.engine_settings import resolve
from cachepilot_sim.validation.ground_truth import GroundTruth
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


def _hash_ids(
    prompt: list[int], output: list[int], parent: list[int], block_tokens: int
) -> list[list[int]]:
    """Per request, one hash id per prompt block (the last one partial). A turn repeats its
    parent's ids for every block that is full in the parent's prompt + reply: the parent's partial
    last prompt block counts once its reply filled it (the engine hashes blocks completed by
    decoding too); blocks made of reply tokens only get fresh ids (the simulator's prefix cache
    holds prompt blocks)."""
    out: list[list[int]] = []
    next_id = 0
    for i, tokens in enumerate(prompt):
        num_blocks = -(-tokens // block_tokens)
        ids: list[int] = []
        p = parent[i]
        if p >= 0:
            full = (prompt[p] + output[p]) // block_tokens
            ids = out[p][: min(len(out[p]), full, tokens // block_tokens)]
        fresh = num_blocks - len(ids)
        out.append(ids + list(range(next_id, next_id + fresh)))
        next_id += fresh
    return out


def workload_from_ground_truth(
    gt: GroundTruth, block_tokens: int
) -> tuple[ReplayWorkload, pl.DataFrame]:
    """The ReplayWorkload of `gt` (rows in send order) and that order's request frame."""
    df = replay_order(gt)
    prompt = df["prompt_tokens"].to_list()
    parent = df["parent_row"].to_list()
    ids = _hash_ids(prompt, df["output_tokens"].fill_null(0).to_list(), parent, block_tokens)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in ids])
    n = df.height
    output = (
        df["output_tokens"]
        .fill_null(df["max_new_tokens"] if "max_new_tokens" in df.columns else 1)
        .to_numpy()
        .astype(np.int64)
    )
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


def simulate(cfg: SimConfig, gt: GroundTruth) -> tuple[GroundTruth, dict[str, Any]]:
    """Run `gt`'s request list through the simulator; the result in the ground-truth shape (so
    the same metrics apply) and the simulator's run metrics."""
    from cachepilot_sim.sim import build  # the core, imported only when a replay runs

    workload, order = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    simulation = build(cfg, None, workload)
    result = simulation.run()
    gaps = simulation.batcher.stats.itl_gaps  # every token after a request's first: exact
    itl = np.repeat(np.fromiter(gaps, np.int64, len(gaps)), list(gaps.values()))
    sim = result.requests.sort("request")
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
    )
    out = GroundTruth(Path(gt.path), frame, None, {"engine": "cachepilot-sim"}, pl.Series(itl))
    return out, result.metrics
