"""Evictor benchmark: our PERC CachePolicy vs vLLM's own LRU and ARC on one op stream.

A CPU tier of `capacity` chunks (2000 by default) and the simulator's mixed session workload; the
trace is cut where vLLM's LRU makes its `decisions`-th eviction decision (1000 by default) and every
policy replays exactly that prefix. Reported per policy: realized restore seconds (reload of the
head run of hits + recompute of the rest), hit ratio, and the CPU time of each evict() call. With
`--repeats R` the policies replay the prefix R times in turn (perc, reuse_forecast, lru, arc, perc,
...), so that all see the same load, and a decision's time is its least over the R replays (the
replays are identical: same victims, same restore, checked).

    python -m cachepilot_sim.integrations.vllm.evictor_bench --out experiments/vllm_evictor
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import HardwareConfig, ModelConfig, WorkloadConfig
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.replay import (
    ReplayConfig,
    Replayer,
    ReplayStats,
    Turn,
    VllmTypes,
    make_turns,
    replay,
)

POLICIES = ("perc", "reuse_forecast", "lru", "arc")
PolicyFactory = Callable[[int, list[int]], Any]


def load_workload(path: Path, session_rate_per_s: float = 0.0) -> WorkloadConfig:
    """A workload YAML (conf/workload/*.yaml) with exactly its own classes; a positive
    `session_rate_per_s` replaces the file's arrival rate."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(WorkloadConfig)
    node.classes = {}
    node = OmegaConf.merge(node, OmegaConf.load(path))
    if session_rate_per_s > 0:
        node.session_rate_per_s = session_rate_per_s
    wl = OmegaConf.to_object(node)
    assert isinstance(wl, WorkloadConfig)
    return wl


def vllm_setup(params: PercParams) -> tuple[VllmTypes, dict[str, PolicyFactory]]:
    """vLLM's ChunkStatus, ReqContext, LRU and ARC (through its factory), and our policy."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from cachepilot_sim.integrations.vllm.policy import (
        FORECAST_POLICY_NAME,
        MODULE_PATH,
        POLICY_NAME,
        PercCachePolicy,
        ReuseForecastCachePolicy,
    )

    def builtin(name: str) -> PolicyFactory:
        return lambda cap, clock: CachePolicyFactory.get_cache_policy_cls(name)(cache_capacity=cap)

    def perc(cap: int, clock: list[int]) -> Any:
        # Resolved the way vLLM resolves cache_policy_module_path; params and clock are ours.
        assert CachePolicyFactory.get_cache_policy_cls(POLICY_NAME, MODULE_PATH) is PercCachePolicy
        return PercCachePolicy(cache_capacity=cap, params=params, clock=lambda: clock[0])

    def forecast(cap: int, clock: list[int]) -> Any:
        cls = CachePolicyFactory.get_cache_policy_cls(FORECAST_POLICY_NAME, MODULE_PATH)
        assert cls is ReuseForecastCachePolicy
        return cls(cache_capacity=cap, params=params, clock=lambda: clock[0])

    return VllmTypes(ChunkStatus, ReqContext), {
        "perc": perc,
        "reuse_forecast": forecast,
        "lru": builtin("lru"),
        "arc": builtin("arc"),
    }


def run_policy(
    factory: PolicyFactory,
    types: VllmTypes,
    turns: Sequence[Turn],
    capacity: int,
    tokens_per_chunk: int,
    max_decisions: int | None = None,
) -> tuple[ReplayStats, int]:
    clock = [0]
    rep = Replayer(
        factory(capacity, clock),
        capacity,
        types,
        HardwareConfig(),
        ModelConfig(),
        tokens_per_chunk,
        clock,
    )
    # CPU time of this thread: other processes on a shared host do not inflate a decision's time.
    started = replay(rep, list(turns), time.thread_time_ns, max_decisions)
    return rep.stats, started


def summarize(stats: ReplayStats, decision_ns: Sequence[int] | None = None) -> dict[str, float]:
    """One cell's figures; `decision_ns` replaces the replay's own decision times."""
    ns = np.asarray(stats.decision_ns if decision_ns is None else decision_ns, dtype=np.float64)
    hits, misses = stats.num_hit_chunks, stats.num_missed_chunks
    return {
        "restore_s": stats.restore_us / 1e6,
        "recompute_s": stats.recompute_us / 1e6,
        "reload_s": stats.reload_us / 1e6,
        "hit_ratio": hits / max(hits + misses, 1),
        "decisions": stats.num_decisions,
        "failed_decisions": stats.num_failed_decisions,
        "evicted_chunks": stats.num_evicted_chunks,
        "turns": stats.num_turns,
        "decision_us_mean": float(ns.mean() / 1e3) if ns.size else 0.0,
        "decision_us_p50": float(np.percentile(ns, 50) / 1e3) if ns.size else 0.0,
        "decision_us_p99": float(np.percentile(ns, 99) / 1e3) if ns.size else 0.0,
    }


def replay_in_turn(
    factories: dict[str, PolicyFactory],
    types: VllmTypes,
    turns: Sequence[Turn],
    args: argparse.Namespace,
) -> dict[str, dict[str, float]]:
    """Each policy's cell: the policies replay `turns` `args.repeats` times in turn; a decision's
    time is its least over the replays, which must agree on everything else."""
    stats: dict[str, ReplayStats] = {}
    times: dict[str, list[list[int]]] = {name: [] for name in POLICIES}
    for _ in range(args.repeats):
        for name in POLICIES:
            cell, _ = run_policy(
                factories[name], types, turns, args.capacity, args.tokens_per_chunk
            )
            times[name].append(cell.decision_ns)
            cell.decision_ns = []
            if stats.setdefault(name, cell) != cell:
                raise RuntimeError(f"{name}: two replays of one op stream made different decisions")
    return {
        name: summarize(stats[name], np.min(np.asarray(times[name]), axis=0).tolist())
        for name in POLICIES
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workload = load_workload(Path(args.workload), args.session_rate_per_s)
    params = PercParams(delta_s=args.delta_s, tokens_per_chunk=args.tokens_per_chunk)
    types, factories = vllm_setup(params)
    cells: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for seed in range(args.seeds):
        cfg = ReplayConfig(args.tokens_per_chunk, args.decode_token_ms, args.sessions, seed)
        turns = make_turns(workload, cfg)
        _, cut = run_policy(
            factories["lru"], types, turns, args.capacity, args.tokens_per_chunk, args.decisions
        )
        for name, cell in replay_in_turn(factories, types, turns[:cut], args).items():
            cells.append({"policy": name, "seed": seed, **cell})
    host = {"load_avg_1_5_15_before": load_before, "load_avg_1_5_15_after": os.getloadavg()}
    return {"config": vars(args), "host": host, "cells": cells, "summary": aggregate(cells)}


def aggregate(cells: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and sample std per policy; restore cost and mean decision time also as paired ratios
    to LRU's per seed."""
    lru = {c["seed"]: c["restore_s"] for c in cells if c["policy"] == "lru"}
    lru_us = {c["seed"]: c["decision_us_mean"] for c in cells if c["policy"] == "lru"}
    out: dict[str, dict[str, float]] = {}
    for name in POLICIES:
        mine = [c for c in cells if c["policy"] == name]
        row: dict[str, float] = {}
        for key in (
            "restore_s",
            "hit_ratio",
            "decisions",
            "decision_us_mean",
            "decision_us_p50",
            "decision_us_p99",
        ):
            vals = np.array([c[key] for c in mine], dtype=np.float64)
            row[key] = float(vals.mean())
            row[key + "_std"] = float(vals.std(ddof=1)) if vals.size > 1 else 0.0
        for key, base in (("restore_s", lru), ("decision_us_mean", lru_us)):
            ratio = np.array([c[key] / base[c["seed"]] for c in mine], dtype=np.float64)
            label = "vs_lru" if key == "restore_s" else "us_vs_lru"
            row[label] = float(ratio.mean())
            row[label + "_std"] = float(ratio.std(ddof=1)) if ratio.size > 1 else 0.0
        out[name] = row
    return out


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| policy | realized restore s | vs LRU (paired) | hit ratio | decisions "
        "| µs per decision: mean | p50 | p99 | mean µs vs LRU (paired) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["summary"].items():
        lines.append(
            f"| {name} | {r['restore_s']:.1f} ± {r['restore_s_std']:.1f} "
            f"| {r['vs_lru']:.3f} ± {r['vs_lru_std']:.3f} | {r['hit_ratio']:.3f} "
            f"| {r['decisions']:.0f} | {r['decision_us_mean']:.1f} | {r['decision_us_p50']:.1f} "
            f"| {r['decision_us_p99']:.1f} | {r['us_vs_lru']:.2f} ± {r['us_vs_lru_std']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--capacity", type=int, default=2000, help="CPU chunks")
    p.add_argument("--decisions", type=int, default=1000, help="cut at LRU's n-th decision")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sessions", type=int, default=3000, help="sessions generated per seed")
    p.add_argument("--tokens-per-chunk", type=int, default=256)
    p.add_argument("--decode-token-ms", type=float, default=20.0)
    p.add_argument("--delta-s", type=float, default=30.0)
    p.add_argument("--workload", default=str(CONF_DIR / "workload" / "mixed.yaml"))
    p.add_argument("--session-rate-per-s", type=float, default=1.0, help="0: the file's rate")
    p.add_argument("--repeats", type=int, default=1, help="replays per policy, taken in turn")
    p.add_argument("--out", default="", help="folder for results.json and results.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    table = to_markdown(result)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "results.md").write_text(table)


if __name__ == "__main__":
    main()
