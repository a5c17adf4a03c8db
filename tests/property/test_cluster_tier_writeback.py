"""Write-back to the shared KV tier (`cluster.shared_tier.write=ON_EVICTION`) under random prefix
traces, caches and links: whatever is evicted, held for a write, offloaded or dropped, every
request ends, every replica's pool and the store are conserved, nothing is left in flight, and
no block is written while the store holds it."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.kv.prefix import PrefixKvManager
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.config import (
    ClusterConfig,
    LinkKind,
    SharedTierConfig,
    TierLoad,
    TierWrite,
    router_config,
)
from cachepilot_sim.sim import make_simulation
from tests.unit.test_cluster import replay_cfg

# A request: its arrival gap (ms) and a chain drawn from a small tree of hashes, so that chains
# share prefixes and branch (a child hash is 10 x its parent + a digit).
chain = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(
    lambda digits: [int("1" + "".join(map(str, digits[: i + 1]))) for i in range(len(digits))]
)
request = st.tuples(st.integers(0, 3000), chain)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(request, min_size=1, max_size=10),
    max_blocks=st.integers(2, 8),
    offload=st.booleans(),
    load=st.sampled_from([TierLoad.ALWAYS, TierLoad.CHEAPER]),
    tcp_gb_per_s=st.sampled_from([0.2, 12.5]),
    capacity_blocks=st.integers(1, 12),
)
def test_write_back_conserves_memory_and_ends_every_request(
    rows: list[tuple[int, list[int]]],
    max_blocks: int,
    offload: bool,
    load: TierLoad,
    tcp_gb_per_s: float,
    capacity_blocks: int,
) -> None:
    t, lines = 0, []
    for gap, hashes in rows:
        t += gap
        line = {"timestamp": t, "input_length": 512 * len(hashes), "output_length": 8}
        lines.append(json.dumps(line | {"hash_ids": hashes}) + "\n")
    tier = SharedTierConfig(
        capacity_gb=capacity_blocks * 0.0675,  # 67.1 MB blocks: capacity_blocks of them
        write=TierWrite.ON_EVICTION,
        load=load,
        link=LinkKind.TCP,
    )
    cluster = ClusterConfig(replicas=2, shared_tier=tier, tcp_gb_per_s=tcp_gb_per_s)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text("".join(lines))
        cfg = replay_cfg(limit=0, cluster=cluster, router=router_config("round_robin"))
        cfg = replace(
            cfg,
            replay=replace(cfg.replay, path=str(path), prefix_cache_max_blocks=max_blocks),
            kv=replace(cfg.kv, offload_enabled=offload),
        )
        sim = make_simulation(cfg)
        assert isinstance(sim, ClusterSimulation)
        m = sim.run().metrics  # raises if a pool or the store is not conserved
    assert m["completed"] + m["rejected"] == m["requests"] == len(rows)
    event(f"blocks written: {min(m['shared_write_blocks'], 3)}+")
    store = sim.shared
    assert store is not None and store.conserved() and store.writing_bytes == 0
    # Written only while absent: without store evictions, each hash at most once.
    if m["shared_evictions"] == 0:
        assert m["shared_write_blocks"] == len(store.entries)
    for replica in sim.replicas:
        kv = replica.kv
        assert isinstance(kv, PrefixKvManager)
        assert kv.pool.conserved() and kv.pool.in_flight_bytes == 0
        assert kv.off_gpu.holding == {}
        assert kv.transfers.pending_free_bytes == 0
        assert all(b.tier in (Tier.GPU, Tier.CPU) for b in kv.tree.blocks.values())
        assert all(b.refcount == 0 for b in kv.tree.blocks.values())
