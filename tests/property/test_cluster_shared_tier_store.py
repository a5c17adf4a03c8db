"""The shared KV store (cluster/shared_tier.py) under random writes, loads and clock steps: every
byte is in exactly one state (free, WRITING, STORED), capacity is never exceeded, a block being
read is never evicted, and only blocks the store holds are served."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cluster.network import Network
from cachepilot_sim.cluster.shared_tier import BlockState, SharedKvTier
from cachepilot_sim.config import ClusterConfig, SharedTierConfig
from tests.unit.test_cluster import replay_cfg

NUM_REPLICAS = 3
BLOCK_GB = 128 * 1024 * 512 / 1e9  # Llama-3-8B's KV bytes per token x a 512-token block

write = st.tuples(
    st.just("write"), st.integers(0, NUM_REPLICAS - 1), st.lists(st.integers(0, 11), max_size=6)
)
load = st.tuples(st.just("load"), st.integers(0, NUM_REPLICAS - 1), st.integers(0, 11))
step = st.tuples(st.just("step"), st.integers(1, 20), st.just(0))  # (step, how many, -)


def check(tier: SharedKvTier, pinned: dict[int, Any]) -> None:
    assert tier.conserved()
    assert 0 <= tier.stored_bytes + tier.writing_bytes <= tier.capacity_bytes
    for h, block in pinned.items():  # a block a load is reading is the same STORED block
        assert h in tier.blocks and tier.blocks[h] is block
        assert tier.blocks[h].state == BlockState.STORED


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.one_of(write, load, step), max_size=60),
    policy=st.sampled_from(["lru", "s3fifo", "perc", "sieve"]),
    capacity_blocks=st.integers(1, 6),
)
def test_store_keeps_each_block_in_one_state_within_capacity(
    ops: list[tuple[str, int, object]], policy: str, capacity_blocks: int
) -> None:
    shared = SharedTierConfig(capacity_gb=(capacity_blocks + 0.5) * BLOCK_GB, policy=policy)
    cfg = replay_cfg(cluster=ClusterConfig(replicas=NUM_REPLICAS, shared_tier=shared))
    env = SimEnvironment()
    tier = SharedKvTier(env, cfg, Network(env, cfg.cluster, NUM_REPLICAS))
    assert tier.capacity_bytes // tier.block_bytes == capacity_blocks
    for kind, a, b in ops:
        if kind == "write":  # the only operation that evicts
            assert isinstance(b, list)
            being_read = {h: blk for h, blk in tier.blocks.items() if blk.readers}
            tier.store(a, [(h, 0, 1000.0) for h in dict.fromkeys(b)])
            check(tier, being_read)
        elif kind == "load":
            assert isinstance(b, int)
            ids = [*range(b, 12)]
            num = tier.num_stored(ids, 0)
            if num:
                tier.start_load(a, ids[:num])
        else:
            for _ in range(a):
                if env.peek() == float("inf"):
                    break
                env.step()
                check(tier, {})
        check(tier, {})
    env.run()
    check(tier, {})
    assert tier.writing_bytes == 0 and all(blk.readers == 0 for blk in tier.blocks.values())
