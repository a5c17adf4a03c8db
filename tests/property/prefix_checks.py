"""The prefix KV manager's invariants, checked from scratch against its indexes and counters."""

from __future__ import annotations

from cachepilot_sim.components.kv import PrefixKvManager, Tier

GPU_SIDE = (Tier.GPU, Tier.FLIGHT_IN)


def check(kv: PrefixKvManager) -> None:
    blocks = kv.tree.blocks
    resident_children: dict[int, int] = {h: 0 for h in blocks}
    for h, b in blocks.items():
        if b.parent is not None:
            assert blocks.get(b.parent.hash_id) is b.parent, "a cached block lost its prefix"
            assert b.parent.children.get(h) is b
            if b.tier in GPU_SIDE:
                assert b.parent.tier in GPU_SIDE, "a GPU block extends a CPU block"
                resident_children[b.parent.hash_id] += 1
    refs: dict[int, int] = {h: 0 for h in blocks}
    holders = [r.chain for r in kv.running.values()]
    holders += list(kv.cpu_tier.held.values())
    for chain in holders:
        for b in chain:
            assert blocks.get(b.hash_id) is b
            refs[b.hash_id] += 1
    for h, b in blocks.items():
        assert b.num_children == resident_children[h] and b.refcount == refs[h]
    idle_tails = {
        h
        for h, b in blocks.items()
        if b.tier == Tier.GPU and b.refcount == 0 and b.num_children == 0
    }
    assert set(kv.tree.evictable) == idle_tails
    idle = sum(b.tier == Tier.GPU and b.refcount == 0 for b in blocks.values())
    assert kv.evictable_bytes() == idle * kv.hash_bytes  # what the admission gate reads
    count = {t: sum(b.tier == t for b in blocks.values()) for t in Tier}
    orphans = kv.cpu_tier.orphans
    hb = kv.hash_bytes
    private = sum(r.private_pages for r in kv.running.values()) * kv.block_bytes[0]
    assert kv.pool.used_bytes == count[Tier.GPU] * hb + private
    assert (
        kv.pool.in_flight_bytes == (count[Tier.FLIGHT_OUT] + count[Tier.FLIGHT_IN] + orphans) * hb
    )
    assert kv.cpu.used_bytes == (
        (count[Tier.CPU] + count[Tier.FLIGHT_OUT] + orphans) * kv.cpu_hash_bytes
    )
    assert kv.cpu.used_bytes <= kv.cpu.capacity_bytes or not kv.offload_enabled
    assert kv.tree.num_gpu_blocks == count[Tier.GPU] + count[Tier.FLIGHT_IN]
    assert kv.pool.conserved()
