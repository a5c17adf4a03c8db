"""A cluster of replicas on one clock (cachepilot_sim/cluster/): one replica reproduces the
single-GPU run exactly, every router places every request exactly once and every request ends,
session affinity keeps sessions whole, prefix-aware routing finds more cached prefix than
round robin, and each replica's pool and request counts are conserved."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.request import Outcome
from cachepilot_sim.config import (
    ClusterConfig,
    ConfigError,
    ModelConfig,
    ReplayConfig,
    SimConfig,
    TraceConfig,
    TraceFormat,
    known_routers,
    router_config,
)
from cachepilot_sim.result import SimResult
from cachepilot_sim.sim import Simulation, build, make_simulation
from tests.conftest import make_sim_config

MOONCAKE = "samples:mooncake_synthetic/synthetic_trace.jsonl"


def replay_cfg(limit: int = 300, **overrides: Any) -> SimConfig:
    """The Mooncake sample (multi-turn, 512-token prefix hashes) on small GPUs."""
    values: dict[str, Any] = dict(
        vram_gb=24.0,
        model=ModelConfig(max_context_tokens=131_072),
        trace=TraceConfig(enabled=False),
        replay=ReplayConfig(format=TraceFormat.MOONCAKE, path=MOONCAKE, limit=limit),
    )
    return make_sim_config(**(values | overrides))


@cache
def routed(router: str, replicas: int = 4) -> tuple[ClusterSimulation, SimResult]:
    cfg = replay_cfg(cluster=ClusterConfig(replicas=replicas), router=router_config(router))
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    return sim, sim.run()


def same_metrics(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k, v in a.items() if b[k] != v and not (v != v and b[k] != b[k])]


@pytest.mark.parametrize("workload", ["sessions", "replay"])
def test_one_replica_cluster_reproduces_the_single_gpu_run_exactly(workload: str) -> None:
    cfg = (
        make_sim_config(trace=TraceConfig(enabled=False))
        if workload == "sessions"
        else replay_cfg()
    )
    single = build(cfg).run()
    cluster = ClusterSimulation(cfg).run()  # forced through the router with one replica
    assert single.requests.equals(cluster.requests.drop("replica"))
    assert same_metrics(single.metrics, cluster.metrics) == []
    assert cluster.metrics["replica_requests"] == [single.metrics["requests"]]


def test_default_cluster_config_builds_the_single_gpu_simulation() -> None:
    assert isinstance(make_simulation(make_sim_config()), Simulation)
    with pytest.raises(ValueError, match="make_simulation"):
        build(make_sim_config(cluster=ClusterConfig(replicas=2)))


@pytest.mark.parametrize("router", known_routers())
def test_every_router_places_every_request_once_and_every_request_ends(router: str) -> None:
    sim, result = routed(router)
    reqs = sim.clients.requests
    assert sorted(sim.router.placement) == sorted(r.req_id for r in reqs)
    assert all(r.outcome != Outcome.PENDING for r in reqs)
    assert sum(result.metrics["replica_requests"]) == len(reqs)
    # Conservation per replica: what was routed there ended there, and its pool balances.
    frame = result.requests
    for i, replica in enumerate(sim.replicas):
        mine = frame.filter(pl.col("replica") == i)
        assert mine.height == sim.router.num_routed[i]
        assert sim.router.outstanding(i) == 0
        assert replica.pool.conserved()
        assert replica.pool.used_bytes + replica.pool.free_bytes == replica.pool.capacity_bytes


def test_round_robin_spreads_requests_evenly() -> None:
    counts = routed("round_robin")[1].metrics["replica_requests"]
    assert max(counts) - min(counts) <= 1


def test_session_affinity_keeps_each_session_on_one_replica() -> None:
    frame = routed("session_affinity")[1].requests
    per_session = frame.group_by("session").agg(pl.col("replica").n_unique())
    assert per_session["replica"].max() == 1
    assert frame["replica"].n_unique() > 1  # and still spreads sessions


def test_session_affinity_keeps_synthetic_sessions_on_one_replica() -> None:
    cfg = make_sim_config(trace=TraceConfig(enabled=False), cluster=ClusterConfig(replicas=3))
    result = make_simulation(cfg).run()
    per_session = result.requests.group_by("session").agg(pl.col("replica").n_unique())
    assert per_session["replica"].max() == 1
    assert result.metrics["completed"] + result.metrics["rejected"] == result.metrics["requests"]


def test_prefix_aware_routing_hits_more_cached_prefix_than_round_robin() -> None:
    rr = routed("round_robin")[1].metrics["cluster_hit_ratio"]
    pa = routed("prefix_aware")[1].metrics["cluster_hit_ratio"]
    assert pa > rr + 0.1, (pa, rr)


def test_prefix_aware_falls_back_to_the_least_loaded_replica_when_imbalanced() -> None:
    from cachepilot_sim.cluster.routers import PrefixAware, PrefixAwareConfig
    from cachepilot_sim.components.request import Request

    class View:
        num_replicas = 3
        load = [40, 2, 5]

        def outstanding(self, i: int) -> int:
            return self.load[i]

        def kv_load(self, i: int) -> float:
            return 0.0

    router = PrefixAware(PrefixAwareConfig(name="prefix_aware"), 3)
    router._insert(0, [1, 2, 3])  # replica 0 holds the whole prefix
    env = make_simulation(make_sim_config()).env
    req = Request(env, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 1)
    req.hash_ids = [1, 2, 3]
    View.load = [10, 2, 5]
    assert router.choose(req, View()) == 0  # balanced: the full match wins over a lighter load
    View.load = [40, 2, 5]
    assert router.choose(req, View()) == 1  # 40 - 2 > 32 and 40 > 1.1 x 2: by load


def test_a_cluster_needs_a_sticky_router_for_session_keyed_kv() -> None:
    with pytest.raises(ConfigError, match="router.name"):
        make_sim_config(cluster=ClusterConfig(replicas=2), router=router_config("round_robin"))
    # one replica: any router is the single-GPU run
    make_sim_config(router=router_config("round_robin"))


def test_cluster_runs_are_deterministic() -> None:
    cfg = replay_cfg(
        limit=150, cluster=ClusterConfig(replicas=3), router=router_config("prefix_aware")
    )
    a, b = make_simulation(cfg).run(), make_simulation(cfg).run()
    assert a.requests.equals(b.requests)


def test_a_cluster_cell_runs_through_the_experiment_runner(tmp_path: Path) -> None:
    from cachepilot_sim.experiment.runner import run_cell

    cfg = make_sim_config(cluster=ClusterConfig(replicas=2))
    metrics = run_cell(cfg, tmp_path, write_requests=True)
    assert metrics["cluster_replicas"] == 2 and sum(metrics["replica_requests"]) == 120
    frame = pl.read_parquet(next((tmp_path / "requests").glob("*.parquet")))
    assert set(frame["replica"].to_list()) == {0, 1}
