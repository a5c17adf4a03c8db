"""The cluster's shared KV tier (cluster/shared_tier.py, components/kv/remote.py): a second replica
loads prefixes the first computed over the network instead of recomputing them, every byte of the
store is in exactly one state, runs are deterministic, capacity 0 is today's cluster exactly, and
bad keys are refused by name.

An intended change of cluster results regenerates the golden file:
`python -m tests.unit.test_cluster_shared_tier`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from cachepilot_sim.cluster.network import handover_us, link_fits
from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.request import KvSource
from cachepilot_sim.config import (
    ClusterConfig,
    ConfigError,
    LinkKind,
    SharedTierConfig,
    TraceConfig,
    router_config,
)
from cachepilot_sim.result import SimResult
from cachepilot_sim.sim import make_simulation
from tests.conftest import make_sim_config
from tests.unit.test_cluster import replay_cfg, same_metrics

GOLDEN = Path(__file__).parents[1] / "data" / "golden_cluster_requests.csv"
GOLDEN_METRICS = GOLDEN.with_suffix(".json")


def cluster(capacity_gb: float = 0.0, replicas: int = 4, **tier: Any) -> ClusterConfig:
    return ClusterConfig(
        replicas=replicas, shared_tier=SharedTierConfig(capacity_gb=capacity_gb, **tier)
    )


@cache
def tiered(
    router: str = "round_robin", capacity_gb: float = 100.0, policy: str = "lru", limit: int = 300
) -> tuple[ClusterSimulation, SimResult]:
    cfg = replay_cfg(
        limit=limit,
        cluster=cluster(capacity_gb, policy=policy),
        router=router_config(router),
    )
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    return sim, sim.run()


def golden_runs() -> tuple[pl.DataFrame, dict[str, Any]]:
    """Today's cluster (no shared tier) on the replay sample: co-located round robin and a P/D
    split (whose handovers use the network model the tier shares)."""
    frames, metrics = [], {}
    shapes = {
        "round_robin": ClusterConfig(replicas=4, shared_tier=SharedTierConfig(capacity_gb=0)),
        "pd": ClusterConfig(prefill_replicas=2, decode_replicas=2, gpus_per_node=2),
    }
    for name, shape in shapes.items():
        router = router_config("round_robin" if name == "round_robin" else "prefix_aware")
        result = make_simulation(replay_cfg(limit=150, cluster=shape, router=router)).run()
        frames.append(result.requests.with_columns(pl.lit(name).alias("shape")))
        metrics[name] = {k: v for k, v in result.metrics.items() if isinstance(v, int | float)}
    return pl.concat(frames), metrics


def test_capacity_zero_reproduces_the_cluster_results_from_before_the_tier_exactly() -> None:
    frame, metrics = golden_runs()
    assert_frame_equal(frame, pl.read_csv(GOLDEN, schema=frame.schema))
    expected = json.loads(GOLDEN_METRICS.read_text())
    assert same_metrics(expected["round_robin"], metrics["round_robin"]) == []
    assert same_metrics(expected["pd"], metrics["pd"]) == []
    assert not any(k.startswith("shared_") for k in metrics["round_robin"])


def test_a_second_replica_loads_prefixes_the_first_computed_instead_of_recomputing() -> None:
    off = tiered(capacity_gb=0.0)[1].metrics
    sim, on = tiered()
    m = on.metrics
    # Round robin sends a session's turns to different replicas: with the tier they find the
    # prefix their predecessors computed elsewhere and pay network time for it.
    assert m["shared_load_blocks"] > 0 and m["shared_loads"] > 0
    assert m["cluster_hit_ratio"] > off["cluster_hit_ratio"] + 0.1
    assert m["realized_recompute_s"] < off["realized_recompute_s"]
    computed = sum(r.prefill_tokens for r in sim.clients.requests)
    assert computed < sum(r.prefill_tokens for r in tiered(capacity_gb=0.0)[0].clients.requests)
    # Network time paid: at least latency + bytes / bandwidth of each load, per load.
    fit = link_fits(sim.cfg.cluster)[LinkKind.RDMA]
    block_bytes = sim.shared.block_bytes if sim.shared else 0
    floor = handover_us(fit, block_bytes) * m["shared_loads"] / 1e6
    assert m["shared_load_s"] >= floor > 0
    assert m["shared_load_gb"] == pytest.approx(m["shared_load_blocks"] * block_bytes / 1e9)


def two_turns(tmp_path: Path, capacity_gb: float) -> tuple[ClusterSimulation, SimResult]:
    """Two requests 10 s apart sharing 4 prefix blocks, on 2 replicas by round robin."""
    path = tmp_path / "two_turns.jsonl"
    rows = [
        {"timestamp": t_ms, "input_length": 512 * n, "output_length": 16, "hash_ids": [*range(n)]}
        for t_ms, n in ((0, 4), (10_000, 5))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = replay_cfg(limit=0, cluster=cluster(capacity_gb, replicas=2))
    cfg = replace(
        cfg, replay=replace(cfg.replay, path=str(path)), router=router_config("round_robin")
    )
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    return sim, sim.run()


def test_the_second_replica_pays_the_network_load_not_the_recompute(tmp_path: Path) -> None:
    off_sim, off = two_turns(tmp_path, 0.0)
    sim, on = two_turns(tmp_path, 100.0)
    assert on.requests["replica"].to_list() == off.requests["replica"].to_list() == [0, 1]
    first, second = sim.clients.requests
    assert off_sim.clients.requests[1].prefill_tokens == 2560  # off: all of it computed again
    assert second.prefill_tokens == 2560 - 4 * 512  # on: only the block the first lacked
    assert second.kv_source == KvSource.HIT and first.prefill_tokens == 2048
    m = on.metrics
    assert m["shared_write_blocks"] == 4 + 1 and m["shared_load_blocks"] == 4
    tier = sim.shared
    assert tier is not None
    paid = handover_us(link_fits(sim.cfg.cluster)[LinkKind.RDMA], 4 * tier.block_bytes)
    assert m["shared_load_s"] == paid / 1e6  # an idle link: latency + bytes / bandwidth
    assert second.admitted_us - second.arrival_us >= paid  # it waited for the load to land
    assert m["realized_recompute_s"] == off.metrics["realized_recompute_s"] == 0.0
    # The first replica's blocks were written once; the second wrote only its new block.
    assert sorted(tier.blocks) == [0, 1, 2, 3, 4]


def test_prefix_aware_routing_leaves_the_tier_little_to_serve() -> None:
    rr = tiered("round_robin")[1].metrics["shared_hit_ratio"]
    pa = tiered("prefix_aware")[1].metrics["shared_hit_ratio"]
    assert pa < rr


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "perc"])
def test_the_store_conserves_bytes_and_respects_capacity_under_its_own_policy(policy: str) -> None:
    sim, result = tiered(capacity_gb=10.0, policy=policy)
    tier = sim.shared
    assert tier is not None and tier.policy.name == policy
    assert tier.conserved()
    assert tier.writing_bytes == 0  # every write landed
    assert tier.peak_bytes <= tier.capacity_bytes
    m = result.metrics
    assert m["shared_evictions"] > 0  # 10 GB holds ~150 blocks: the policy had to choose
    assert m["shared_peak_gb"] <= 10.0
    stored = sum(1 for b in tier.blocks.values() if b.readers == 0)
    assert tier.stored_bytes == stored * tier.block_bytes


def test_shared_tier_runs_are_deterministic() -> None:
    a = make_simulation(replay_cfg(limit=150, cluster=cluster(20.0))).run()
    b = make_simulation(replay_cfg(limit=150, cluster=cluster(20.0))).run()
    assert a.requests.equals(b.requests)
    assert same_metrics(a.metrics, b.metrics) == []


def test_a_tier_too_small_for_one_block_skips_every_write_and_changes_nothing_else() -> None:
    off = tiered(capacity_gb=0.0, limit=150)[1]
    sim, on = tiered(capacity_gb=0.01, limit=150)  # 10 MB: less than one 67 MB block
    assert on.metrics["shared_write_blocks"] == 0 and on.metrics["shared_write_skipped_blocks"] > 0
    assert on.requests.equals(off.requests)


def test_bad_shared_tier_keys_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.capacity_gb"):
        SharedTierConfig(capacity_gb=-1.0)
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.policy.*unknown eviction"):
        SharedTierConfig(capacity_gb=10.0, policy="nope")
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.store_ports"):
        SharedTierConfig(store_ports=0)
    # Synthetic sessions have no prefix hashes to share.
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.capacity_gb.*trace replay"):
        make_sim_config(
            trace=TraceConfig(enabled=False),
            cluster=cluster(10.0, replicas=2),
            router=router_config("session_affinity"),
        )


def test_pd_handovers_and_the_tier_share_one_network_and_every_request_ends() -> None:
    shape = ClusterConfig(
        prefill_replicas=2,
        decode_replicas=2,
        gpus_per_node=2,
        shared_tier=SharedTierConfig(capacity_gb=100.0),
    )
    sim = make_simulation(replay_cfg(limit=150, cluster=shape, router=router_config("round_robin")))
    assert isinstance(sim, ClusterSimulation) and sim.pd is not None and sim.shared is not None
    assert sim.shared.network is sim.pd.network
    m = sim.run().metrics
    assert m["handovers"] == m["requests"] == m["completed"] + m["rejected"]
    assert m["shared_load_blocks"] > 0 and sim.shared.conserved()


def test_one_replica_with_a_shared_tier_runs_as_a_cluster() -> None:
    cfg = replay_cfg(limit=60, cluster=cluster(10.0, replicas=1))
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation) and sim.shared is not None
    assert sim.run().metrics["shared_write_blocks"] > 0


if __name__ == "__main__":
    frame, metrics = golden_runs()
    frame.write_csv(GOLDEN)
    GOLDEN_METRICS.write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} and {GOLDEN_METRICS}")
