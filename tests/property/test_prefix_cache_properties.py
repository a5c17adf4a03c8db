"""Prefix cache invariants under random admit / finish / preempt / evict sequences (hypothesis),
with and without the CPU tier.

After every step: a cached block's parent is cached (chains are only ever cut from the tail), GPU
blocks only extend GPU blocks, child and reference counts match the cache and the running or
reloading requests, the evictable set is exactly the idle GPU tails, and the pool and CPU-store
bytes are what the blocks on each tier (and in flight) plus running private pages hold.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.kv_manager import Admit, Tier
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.prefix_cache import PrefixKvManager
from cachepilot_sim.components.prefix_offload import OffloadingPrefixKvManager
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.cost import compute_fit, transfer_fits
from cachepilot_sim.sim import build
from cachepilot_sim.trace.recorder import NullRecorder
from tests.conftest import make_sim_config

B = 512

# A request: (an earlier request to extend, modulo their number, or -1; how many of its blocks
# to keep; new blocks).
# Short kept prefixes make chains branch (siblings are where suffix-first eviction can go wrong).
requests_st = st.lists(
    st.tuples(st.integers(-1, 7), st.integers(1, 3), st.integers(0, 3)), min_size=2, max_size=6)
ops_st = st.lists(st.tuples(st.sampled_from(["admit", "finish", "admit", "finish", "preempt",
                                             "evict"]),
                            st.integers(0, 7), st.integers(0, 4)), min_size=10, max_size=60)


def chains_of(spec: list[tuple[int, int, int]]) -> list[list[int]]:
    chains: list[list[int]] = []
    next_id = 0
    for parent, keep, new in spec:
        base = chains[parent % len(chains)][:keep] if parent >= 0 and chains else []
        fresh = list(range(next_id, next_id + max(new, 0 if base else 1)))
        next_id += len(fresh)
        chains.append(base + fresh)
    return chains


def make_kv(chains: list[list[int]], policy: str, cap: int, folder: Path,
            cpu_blocks: int = -1) -> PrefixKvManager:
    """cpu_blocks < 0: no CPU tier; else a CPU store of that many blocks."""
    path = folder / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": B * len(c),
                                        "output_length": 40, "hash_ids": c}) + "\n"
                            for i, c in enumerate(chains)))
    cfg = make_sim_config(
        vram_gb=141.0, model=ModelConfig(max_context_tokens=65_536),
        policy=policy_config(policy), trace=TraceConfig(enabled=False),
        kv=KVConfig(offload_enabled=cpu_blocks >= 0,
                    cpu_store_bytes=max(cpu_blocks, 0) * B * 131_072),
        replay=ReplayConfig(format=TraceFormat.MOONCAKE, path=str(path),
                            prefix_cache_max_blocks=cap),
    )
    sim = build(cfg)
    assert sim.replay is not None
    env = SimEnvironment()
    manager = OffloadingPrefixKvManager if cpu_blocks >= 0 else PrefixKvManager
    return manager(env, cfg, VramPool(cfg), PcieLink(env, *transfer_fits(cfg.hardware)),
                   sim.policy, sim.estimator, compute_fit(cfg.hardware), NullRecorder(),
                   sim.replay)


GPU_SIDE = (Tier.GPU, Tier.FLIGHT_IN)


def check(kv: PrefixKvManager) -> None:
    blocks = kv.blocks
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
    holders += list(getattr(kv, "held", {}).values())
    for chain in holders:
        for b in chain:
            assert blocks.get(b.hash_id) is b
            refs[b.hash_id] += 1
    for h, b in blocks.items():
        assert b.num_children == resident_children[h] and b.refcount == refs[h]
    idle_tails = {h for h, b in blocks.items()
                  if b.tier == Tier.GPU and b.refcount == 0 and b.num_children == 0}
    assert set(kv.evictable) == idle_tails
    count = {t: sum(b.tier == t for b in blocks.values()) for t in Tier}
    orphans = getattr(kv, "orphans", 0)
    hb = kv.hash_bytes
    private = sum(r.private_pages for r in kv.running.values()) * kv.block_bytes[0]
    assert kv.pool.used_bytes == count[Tier.GPU] * hb + private
    assert kv.pool.in_flight_bytes == (count[Tier.FLIGHT_OUT] + count[Tier.FLIGHT_IN]
                                       + orphans) * hb
    assert kv.cpu_used_bytes == (count[Tier.CPU] + count[Tier.FLIGHT_OUT] + orphans) * hb
    assert kv.cpu_used_bytes <= kv.cpu_capacity_bytes or not kv.offload_enabled
    assert kv.num_gpu_blocks == count[Tier.GPU] + count[Tier.FLIGHT_IN]
    assert kv.pool.conserved()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Always tried: two chains branching after block 0, both idle, then cut (a parent with a second
# child must not become evictable).
@example(spec=[(-1, 1, 2), (0, 1, 2)], ops=[("admit", 0, 0), ("finish", 0, 0), ("admit", 1, 0),
                                            ("finish", 1, 0), ("evict", 0, 1), ("evict", 0, 1),
                                            ("evict", 0, 4)], policy="lru", cap=0, cpu_blocks=-1)
@given(spec=requests_st, ops=ops_st, policy=st.sampled_from(["lru", "perc", "priority"]),
       cap=st.sampled_from([0, 3, 6]), cpu_blocks=st.sampled_from([-1, 0, 2, 5, 100]))
def test_prefix_cache_invariants_hold_after_every_step(  # noqa: ANN201
    spec, ops, policy, cap, cpu_blocks,  # noqa: ANN001
):
    chains = chains_of(spec)
    with tempfile.TemporaryDirectory() as folder:
        kv = make_kv(chains, policy, cap, Path(folder), cpu_blocks)
    reqs: dict[int, Request] = {}
    for op, i, k in ops:
        i %= len(chains)
        kv.env.run(until=kv.env.now + 1000)
        if op == "admit" and i not in reqs:
            req = Request(kv.env, i, i, 0, 0, 0, 1, kv.env.now, 10**12, 10**9, 0,
                          B * len(chains[i]), 40)
            if kv.admit(req) == Admit.READY:
                reqs[i] = req
        elif op == "finish" and i in reqs:
            req = reqs.pop(i)
            kv.finish(req, req.prompt_tokens + req.output_tokens)
        elif op == "preempt" and i in reqs:
            req = reqs.pop(i)
            kv.preempt(req, min(req.prompt_tokens, k * B))
        elif op == "evict":
            kv._evict_blocks(k)
        check(kv)
        if cap and not reqs and not getattr(kv, "held", None):
            assert kv.num_gpu_blocks <= cap
    kv.env.run()  # every copy lands
    check(kv)
