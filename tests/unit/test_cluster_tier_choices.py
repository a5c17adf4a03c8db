"""The shared KV tier's two choices (cluster/shared_tier.py, components/kv/remote.py): when a
replica writes (`cluster.shared_tier.write`: ON_COMPLETION or ON_EVICTION) and whether it loads
or recomputes the store's run (`cluster.shared_tier.load`: ALWAYS or CHEAPER).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Generator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import simpy
from hydra import compose, initialize_config_dir

from cachepilot_sim.cluster.shared_tier import BlockState
from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.kv.prefix import PrefixKvManager
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.config import (
    ClusterConfig,
    ConfigError,
    LinkKind,
    SharedTierConfig,
    TierLoad,
    TierWrite,
    register_configs,
    router_config,
    to_config,
)
from cachepilot_sim.result import SimResult
from cachepilot_sim.sim import make_simulation
from tests.unit.test_cluster import MOONCAKE, replay_cfg, same_metrics

CONF = Path(__file__).resolve().parents[2] / "cachepilot_sim" / "conf"
EVICT, COMPLETE = TierWrite.ON_EVICTION, TierWrite.ON_COMPLETION


def tier_cluster(replicas: int = 4, capacity_gb: float = 100.0, **tier: Any) -> ClusterConfig:
    link = {k: tier.pop(k) for k in ("tcp_gb_per_s",) if k in tier}
    return ClusterConfig(
        replicas=replicas, shared_tier=SharedTierConfig(capacity_gb=capacity_gb, **tier), **link
    )


def kv(sim: ClusterSimulation, i: int) -> PrefixKvManager:
    manager = sim.replicas[i].kv
    assert isinstance(manager, PrefixKvManager)
    return manager


def trace_run(
    tmp_path: Path,
    rows: list[tuple[int, list[int]]],
    cluster: ClusterConfig,
    max_blocks: int = 0,
    probe: Any = None,
    offload: bool = True,
) -> tuple[ClusterSimulation, SimResult]:
    """Requests (arrival ms, hash ids) of 512 tokens a block and 16 output tokens, placed by
    round robin; `max_blocks` caps each replica's cached blocks (0: no cap); `probe(sim)` is
    started as a process before the run."""
    path = tmp_path / "trace.jsonl"
    text = "".join(
        json.dumps({"timestamp": t, "input_length": 512 * len(h), "output_length": 16,
                    "hash_ids": h}) + "\n"
        for t, h in rows
    )  # fmt: skip
    path.write_text(text)
    cfg = replay_cfg(limit=0, cluster=cluster, router=router_config("round_robin"))
    cfg = replace(
        cfg,
        replay=replace(cfg.replay, path=str(path), prefix_cache_max_blocks=max_blocks),
        kv=replace(cfg.kv, offload_enabled=offload),
    )
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    if probe is not None:
        sim.env.process(probe(sim))
    return sim, sim.run()


# A on replica 0; D (unrelated) on 1; B on 0 pushes A's 4 blocks past a cap of 6 (evicted);
# C on 1 continues A's prefix by one block.
EVICTION_ROWS = [
    (0, [0, 1, 2, 3]),
    (1_000, [100]),
    (10_000, [10, 11, 12, 13, 14, 15]),
    (20_000, [0, 1, 2, 3, 4]),
]


def test_on_eviction_writes_only_the_evicted_blocks_and_another_replica_hits_them(
    tmp_path: Path,
) -> None:
    sim, result = trace_run(tmp_path, EVICTION_ROWS, tier_cluster(2, write=EVICT), max_blocks=6)
    tier = sim.shared
    assert tier is not None
    assert result.requests["replica"].to_list() == [0, 1, 0, 1]
    # Only A's blocks left a GPU (B's stayed cached, C fits under the cap), so only they were
    # written, each once.
    assert sorted(tier.blocks) == [0, 1, 2, 3]
    m = result.metrics
    assert m["shared_write_blocks"] == 4 and m["shared_writes"] == 4
    st = kv(sim, 0).stats
    assert st.evictions_offload + st.evictions_drop == 4
    # C, on the other replica, loads A's prefix from the store and computes one block.
    c = sim.clients.requests[3]
    assert m["shared_load_blocks"] == 4 and c.prefill_tokens == 512
    # Write-through instead writes every block computed anywhere: 4 + 1 + 6 + 1.
    _, through = trace_run(tmp_path, EVICTION_ROWS, tier_cluster(2, write=COMPLETE), max_blocks=6)
    assert through.metrics["shared_write_blocks"] == 12
    assert through.metrics["shared_load_blocks"] == 4


def test_a_parent_the_store_holds_waits_for_its_child_being_written(tmp_path: Path) -> None:
    """Replica 1 evicts (writes) block 0; replica 0 then evicts the chain 0 <- 1 in one cut with
    no CPU tier: 1 is written, and 0 (which the store holds) must not be dropped, taking 1 with
    it, while 1 is in flight: it waits for 1's write, then is dropped."""
    rows = [
        (0, [0, 1]),  # A on 0
        (1, [0]),  # X on 1
        (2, [30]),  # P on 0
        (5_000, [20, 21, 22, 23, 24, 25]),  # Y on 1: evicts X's block 0 (written)
        (10_000, [10, 11, 12, 13, 14, 15]),  # B on 0: evicts 1, 0 and 30
        (20_000, [0, 1, 2]),  # C on 1: loads 0 and 1 from the store
    ]
    sim, result = trace_run(
        tmp_path, rows, tier_cluster(2, write=EVICT), max_blocks=6, offload=False
    )
    assert result.requests["replica"].to_list() == [0, 1, 0, 1, 0, 1]
    tier = sim.shared
    assert tier is not None
    # 0 once (from replica 1), 1 and 30 from replica 0, and Y's tails when C came to replica 1.
    assert sorted(tier.blocks) == [0, 1, 23, 24, 25, 30]
    assert result.metrics["shared_write_blocks"] == len(tier.entries) == 6
    manager = kv(sim, 0)
    assert not {0, 1, 30} & set(manager.tree.blocks) and manager.pool.in_flight_bytes == 0
    assert result.metrics["shared_load_blocks"] == 2
    assert sim.clients.requests[5].prefill_tokens == 512


def test_an_evicted_block_being_written_is_in_flight_not_free_and_then_disposed(
    tmp_path: Path,
) -> None:
    seen: list[tuple[int, int, bool]] = []

    def probe(sim: ClusterSimulation) -> Generator[simpy.Event, object, None]:
        """Every 200 µs over B's admission: pool and store conserved, A's blocks in one state."""
        yield sim.env.timeout(10_000_000)
        manager, tier = kv(sim, 0), sim.shared
        assert tier is not None
        for _ in range(200):
            pool = manager.pool
            assert pool.conserved() and tier.conserved()
            flight = [h for h in range(4) if manager.tree.tier(h) == Tier.FLIGHT_OUT]
            writing = [h for h, b in tier.blocks.items() if b.state == BlockState.WRITING]
            # A block being written is held on the GPU, in flight (not free, not reusable);
            # after its write lands it may be in flight again, to the CPU tier.
            assert set(writing) <= set(flight)
            assert not set(flight) & set(manager.tree.evictable)
            assert pool.in_flight_bytes >= len(flight) * manager.hash_bytes
            seen.append((len(writing), pool.in_flight_bytes, bool(tier.writing_bytes)))
            yield sim.env.timeout(200)

    sim, result = trace_run(
        tmp_path, EVICTION_ROWS, tier_cluster(2, write=EVICT), max_blocks=6, probe=probe
    )
    assert any(n == 4 and writing for n, _, writing in seen)  # the write was caught in flight
    assert seen[-1][0] == 0  # ... and landed: A's blocks were then disposed of
    manager = kv(sim, 0)
    assert all(manager.tree.tier(h) in (None, Tier.CPU) for h in range(4))
    assert manager.pool.in_flight_bytes == 0 and manager.pool.conserved()
    m = result.metrics
    assert m["completed"] + m["rejected"] == m["requests"] == 4


@cache
def sample(write: TierWrite, load: TierLoad = TierLoad.ALWAYS) -> tuple[ClusterSimulation, Any]:
    cfg = replay_cfg(
        limit=300,
        cluster=tier_cluster(4, 5000.0, write=write, load=load),
        router=router_config("round_robin"),
    )
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    return sim, sim.run()


def test_on_eviction_on_the_sample_writes_fewer_blocks_never_one_twice_and_ends_cleanly() -> None:
    sim, result = sample(EVICT)
    tier = sim.shared
    assert tier is not None and tier.conserved() and tier.writing_bytes == 0
    m = result.metrics
    evicted = sum(kv(sim, i).stats.evictions_offload + kv(sim, i).stats.evictions_drop
                  for i in range(4))  # fmt: skip
    assert 0 < m["shared_write_blocks"] <= evicted
    # A store this size never evicts: a block written twice would be written while held.
    assert m["shared_evictions"] == 0 and m["shared_write_blocks"] == len(tier.entries)
    assert m["shared_write_blocks"] < sample(COMPLETE)[1].metrics["shared_write_blocks"]
    assert m["shared_load_blocks"] > 0  # replicas hit what others evicted
    assert m["completed"] + m["rejected"] == m["requests"]
    for i in range(4):
        assert kv(sim, i).pool.conserved() and kv(sim, i).pool.in_flight_bytes == 0


def test_the_default_choices_are_todays_tier() -> None:
    t = SharedTierConfig(capacity_gb=10.0)
    assert (t.write, t.load) == (COMPLETE, TierLoad.ALWAYS)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = ["+experiment=mooncake_synthetic", "cluster=shared_tier"]
        cfg = to_config(compose("config", overrides=base))
        assert (cfg.cluster.shared_tier.write, cfg.cluster.shared_tier.load) == (
            COMPLETE,
            TierLoad.ALWAYS,
        )
        picked = base + [
            "cluster.shared_tier.write=ON_EVICTION",
            "cluster.shared_tier.load=CHEAPER",
        ]
        cfg = to_config(compose("config", overrides=picked))
        assert (cfg.cluster.shared_tier.write, cfg.cluster.shared_tier.load) == (
            EVICT,
            TierLoad.CHEAPER,
        )


def test_bad_write_and_load_values_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.write.*ON_EVICTION"):
        SharedTierConfig(capacity_gb=10.0, write="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"cluster\.shared_tier\.load.*CHEAPER"):
        SharedTierConfig(capacity_gb=10.0, load="never")  # type: ignore[arg-type]


TWO_TURNS = [(0, [0, 1, 2, 3]), (10_000, [0, 1, 2, 3, 4])]


def two_turns(tmp_path: Path, load: TierLoad, tcp_gb_per_s: float) -> tuple[Any, SimResult]:
    cluster = tier_cluster(2, load=load, link=LinkKind.TCP, tcp_gb_per_s=tcp_gb_per_s)
    return trace_run(tmp_path, TWO_TURNS, cluster)


def test_cheaper_recomputes_over_a_very_slow_link_and_pays_less_than_always(
    tmp_path: Path,
) -> None:
    # 0.1 GB/s: 4 blocks of 67 MB take 2.7 s to load; recomputing 2048 tokens takes ~41 ms.
    sim, cheaper = two_turns(tmp_path, TierLoad.CHEAPER, 0.1)
    always_sim, always = two_turns(tmp_path, TierLoad.ALWAYS, 0.1)
    second = sim.clients.requests[1]
    assert second.prefill_tokens == 2560  # recomputed, not loaded
    c, a = cheaper.metrics, always.metrics
    assert c["shared_load_blocks"] == 0 and c["shared_recompute_blocks"] == 4
    assert a["shared_load_blocks"] == 4 and always_sim.clients.requests[1].prefill_tokens == 512
    assert 0 < c["shared_recompute_s"] == c["shared_restore_s"] < a["shared_restore_s"]
    assert a["shared_restore_s"] == a["shared_load_s"] > 2.5
    ttft = cheaper.requests["ttft_us"].to_list()[1], always.requests["ttft_us"].to_list()[1]
    assert ttft[0] < ttft[1]


def test_cheaper_loads_over_a_fast_link_exactly_as_always(tmp_path: Path) -> None:
    # 12.5 GB/s (100 GbE): 4 blocks load in ~21 ms, below the ~41 ms recompute.
    _, cheaper = two_turns(tmp_path, TierLoad.CHEAPER, 12.5)
    _, always = two_turns(tmp_path, TierLoad.ALWAYS, 12.5)
    assert cheaper.metrics["shared_load_blocks"] == 4
    assert cheaper.metrics["shared_recompute_blocks"] == 0
    assert cheaper.requests.equals(always.requests)


def test_the_choices_are_deterministic_per_seed() -> None:
    cluster = tier_cluster(4, write=EVICT, load=TierLoad.CHEAPER, link=LinkKind.TCP)
    cfg = replay_cfg(limit=150, cluster=cluster, router=router_config("round_robin"))
    a, b = make_simulation(cfg).run(), make_simulation(cfg).run()
    assert a.requests.equals(b.requests)
    assert same_metrics(a.metrics, b.metrics) == []
    assert a.metrics["shared_write_blocks"] > 0


@pytest.mark.parametrize("vram_gb", [18.0, 24.0])
@pytest.mark.parametrize("load", [TierLoad.ALWAYS, TierLoad.CHEAPER])
def test_every_request_ends_when_evictions_wait_on_a_slow_network(
    vram_gb: float, load: TierLoad
) -> None:
    """Write-back over a 0.5 GB/s link (~134 ms a block) on small GPUs: evictions wait on the
    network, yet every request completes or is rejected with a reason and nothing is left in
    flight."""
    cluster = tier_cluster(4, 20.0, write=EVICT, load=load, link=LinkKind.TCP, tcp_gb_per_s=0.5)
    cfg = replay_cfg(
        limit=120, vram_gb=vram_gb, cluster=cluster, router=router_config("round_robin")
    )
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation)
    result = sim.run()
    m = result.metrics
    assert m["completed"] + m["rejected"] == m["requests"] == 120
    rejected = result.requests.filter(result.requests["outcome"] != "completed")
    assert rejected["reject_reason"].null_count() == 0
    assert m["shared_write_blocks"] > 0
    tier = sim.shared
    assert tier is not None and tier.conserved() and tier.writing_bytes == 0
    for i in range(4):
        pool = kv(sim, i).pool
        assert pool.conserved() and pool.in_flight_bytes == 0
        assert not any(b.tier == Tier.FLIGHT_OUT for b in kv(sim, i).tree.blocks.values())


def test_the_experiment_section_runs_and_writes_its_row() -> None:
    """`experiments/kv_tier.py --part shared` at a tiny size: one composed run, one table row."""
    spec = importlib.util.spec_from_file_location(
        "kv_tier", Path(__file__).parents[2] / "experiments" / "kv_tier.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register_configs()
    m = module.shared_run([
        "+experiment=mooncake_synthetic", f"replay.path={MOONCAKE}", "replay.limit=40",
        "cluster=shared_tier", "router=round_robin", "policy=lru", *module.LINKS["TCP 3.1 GB/s"],
        "cluster.shared_tier.write=ON_EVICTION", "cluster.shared_tier.load=CHEAPER",
    ])  # fmt: skip
    assert (m["shared_tier_write"], m["shared_tier_load"]) == ("on_eviction", "cheaper")
    row = module.shared_row("TCP 3.1 GB/s", "ON_EVICTION", "CHEAPER", m)
    assert row.startswith("| TCP 3.1 GB/s | on_eviction | cheaper |") and row.count("|") == 13
