"""A cluster's run metrics: the single-GPU keys over all replicas (counts and bytes summed,
utilizations averaged, peaks maxed, ratios recomputed from summed counts), then the cluster's own
keys: per-replica load, hit ratio and TTFT p99, and how evenly the router spread the load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.cluster.replica import Replica
from cachepilot_sim.cluster.router import RequestRouter
from cachepilot_sim.components.clients import Clients
from cachepilot_sim.components.kv.protocol import KvStats
from cachepilot_sim.components.replay_clients import ReplayClients
from cachepilot_sim.config import SimConfig
from cachepilot_sim.metrics import latency_metrics, outcome_metrics, restore_metrics

# KV-manager metrics that are ratios: recomputed from the summed counts, never summed.
_RATIOS = {
    "prefix_hit_ratio": ("hit_blocks", "lookup_blocks"),
    "prefix_hit_token_ratio": ("hit_tokens", "input_tokens"),
}


def summed_stats(replicas: Sequence[Replica]) -> dict[str, float]:
    """Every `KvStats` counter summed over the replicas (`cpu_peak_bytes`: the max)."""
    out: dict[str, float] = {}
    for f in fields(KvStats):
        values = [getattr(r.kv.stats, f.name) for r in replicas]
        out[f.name] = max(values) if f.name == "cpu_peak_bytes" else sum(values)
    return out


def hit_ratio(stats: dict[str, float] | KvStats, frame: pl.DataFrame) -> float:
    """Prefix blocks found cached / looked up (trace replay); for sessions, the share of
    returning turns whose KV was still on the GPU."""
    s = stats if isinstance(stats, dict) else asdict(stats)
    if s["lookup_blocks"]:
        return s["hit_blocks"] / s["lookup_blocks"]
    returning = frame.filter(frame["kv_source"] != "new").height
    return s["hits"] / returning if returning else 0.0


def cluster_metrics(
    cfg: SimConfig,
    frame: pl.DataFrame,
    replicas: Sequence[Replica],
    router: RequestRouter,
    clients: Clients | ReplayClients,
    num_events: int,
) -> dict[str, Any]:
    """Run metrics of a cluster over its per-request table `frame` (with a `replica` column);
    `num_events`: trace rows written."""
    duration = max(int(frame["finish_us"].to_numpy().max(initial=0)), 1)
    kv = summed_stats(replicas)
    engines = [r.batcher.stats for r in replicas]
    capacity = sum(r.pool.capacity_bytes for r in replicas)
    out: dict[str, Any] = {"policy": cfg.policy.name, "seed": cfg.seed}
    out |= outcome_metrics(frame, duration)
    out |= latency_metrics(frame)
    out |= restore_metrics(kv)
    out |= {"kv_convert_s": kv["convert_us"] / 1e6, "cpu_drops": int(kv["cpu_drops"])}
    out |= {k: v for k, v in kv.items() if k.startswith(("evictions_", "evicted_"))}
    out |= {
        "hits": int(kv["hits"]),
        "reloads": int(kv["reloads"]),
        "recomputes": int(kv["recomputes"]),
        "preemptions": int(kv["preemptions"]),
        "cpu_swaps": sum(e.cpu_swaps for e in engines),
        "soft_resets": int(kv["preemptions"]) - sum(e.cpu_swaps for e in engines),
        "graph_captures": sum(e.graph_captures for e in engines),
        "graph_capture_s": sum(e.graph_capture_us for e in engines) / 1e6,
        "promoted": sum(r.queue.num_promoted for r in replicas),
        "sessions": clients.num_sessions,
        "vram_kv_util_mean": sum(e.kv_byte_us for e in engines) / duration / capacity,
        "vram_kv_util_peak": max(
            e.kv_peak_bytes / r.pool.capacity_bytes for e, r in zip(engines, replicas, strict=True)
        ),
        "kv_pool_gb": capacity / 1e9,
        "gpu_busy_frac": sum(e.busy_us for e in engines) / duration / len(replicas),
        "iterations": sum(e.iterations for e in engines),
        "pcie_d2h_gb": sum(r.link.bytes_moved["d2h"] for r in replicas) / 1e9,
        "pcie_h2d_gb": sum(r.link.bytes_moved["h2d"] for r in replicas) / 1e9,
        "events": num_events,
    }
    gates = [r.batcher.gate for r in replicas if r.batcher.gate is not None]
    if gates:
        out |= {
            "admission_deferred": sum(g.num_deferred for g in gates),
            "admission_rejected": sum(g.num_rejected for g in gates),
        }
    out |= _replica_manager_metrics(replicas, kv)
    return out | _cluster_keys(cfg, frame, replicas, router, duration)


def _replica_manager_metrics(replicas: Sequence[Replica], kv: dict[str, float]) -> dict[str, float]:
    """Policy and KV-manager metrics: numbers summed over replicas, ratios recomputed."""
    out: dict[str, float] = {}
    for r in replicas:
        for key, value in (r.policy.metrics() | r.kv.metrics()).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
    for key, (num, den) in _RATIOS.items():
        if key in out:
            out[key] = kv[num] / kv[den] if kv[den] else 0.0
    return out


def _cluster_keys(
    cfg: SimConfig,
    frame: pl.DataFrame,
    replicas: Sequence[Replica],
    router: RequestRouter,
    duration_us: int,
) -> dict[str, Any]:
    """The keys only a cluster has: sizes, per-replica figures, load balance."""
    routed = np.array(router.num_routed, dtype=np.float64)
    ttft_p99, hit = [], []
    # Per routed replica (the prefill replicas of a P/D cluster): its requests and its cache.
    for i, r in enumerate(replicas[: router.num_replicas]):
        mine = frame.filter(pl.col("replica") == i)
        ttft_p99.append(latency_metrics(mine)["ttft_p99_s"])
        hit.append(hit_ratio(r.kv.stats, mine))
    busy = [r.batcher.stats.busy_us / duration_us for r in replicas]
    return {
        "cluster_replicas": len(replicas),
        "cluster_gpus": cfg.cluster.num_gpus,
        "router": cfg.router.name,
        "cluster_hit_ratio": hit_ratio(summed_stats(replicas), frame),
        # max / mean requests routed per replica: 1.0 is a perfectly even spread.
        "load_imbalance": float(routed.max() / routed.mean()) if routed.sum() else 1.0,
        "replica_requests": router.num_routed,
        "replica_hit_ratio": hit,
        "replica_ttft_p99_s": ttft_p99,
        "replica_gpu_busy_frac": busy,
    }
