"""Prefix-sharing KV manager: one refcounted object per hash, tails evicted first, restore costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.components.kv import Admit, PrefixKvManager
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.cost import recompute_us
from cachepilot_sim.sim import Simulation, build
from tests.conftest import make_kv as make_kv_for
from tests.conftest import make_sim_config

B = 512
# Chains: A = 1-2-3-4, B shares 1-2 and adds 5, C is unrelated. Input lengths fill whole blocks.
ROWS = [(0, [1, 2, 3, 4]), (10, [1, 2, 5]), (20, [6])]


def make_sim(tmp_path: Path, policy: str = "lru") -> Simulation:
    """A replay simulation of ROWS (run it, or take its parts for `make_kv`)."""
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"timestamp": t, "input_length": B * len(ids), "output_length": 4, "hash_ids": ids}
            )
            + "\n"
            for t, ids in ROWS
        )
    )
    cfg = make_sim_config(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=65_536),
        policy=policy_config(policy),
        trace=TraceConfig(enabled=False),
        kv=KVConfig(offload_enabled=False),  # this file: the GPU tier alone
        replay=ReplayConfig(format=TraceFormat.MOONCAKE, path=str(path)),
    )
    return build(cfg)


def make_kv(tmp_path: Path, policy: str = "lru") -> PrefixKvManager:
    """A manager on its own clock with no processes, driven call by call."""
    kv = make_kv_for(make_sim(tmp_path, policy).cfg)
    assert isinstance(kv, PrefixKvManager)
    return kv


def request(kv: PrefixKvManager, i: int) -> Request:
    _, ids = ROWS[i]
    req = Request(kv.env, i, i, 0, 0, 0, 1, kv.env.now, 10**12, 10**9, 0, B * len(ids), 4)
    req.hash_ids = list(ids)
    return req


def run_alone(kv: PrefixKvManager, req: Request) -> None:
    assert kv.admit(req) == Admit.READY
    kv.finish(req, req.prompt_tokens + req.output_tokens)


def advance(kv: PrefixKvManager, us: int) -> None:
    kv.env.run(until=kv.env.now + us)


def test_equal_hashes_are_one_cached_object_with_a_reference_count(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    a, b = request(kv, 0), request(kv, 1)
    used0 = kv.pool.used_bytes
    assert kv.admit(a) == Admit.READY and kv.admit(b) == Admit.READY
    assert sorted(kv.tree.blocks) == [1, 2, 3, 4, 5]
    assert [kv.tree.blocks[h].refcount for h in (1, 2, 3, 4, 5)] == [2, 2, 1, 1, 1]
    assert kv.pool.used_bytes - used0 == 5 * kv.hash_bytes  # shared blocks allocated once
    assert b.kv_source == KvSource.HIT and b.prefill_tokens == 3 * B - 2 * B
    assert not kv.tree.evictable  # everything is referenced
    kv.finish(a, a.prompt_tokens + 4)
    assert sorted(kv.tree.evictable) == [4]  # 3 has a cached child; 1 and 2 are still referenced
    kv.finish(b, b.prompt_tokens + 4)
    assert sorted(kv.tree.evictable) == [4, 5]
    assert kv.stats.hit_blocks == 2 and kv.stats.lookup_blocks == 7


def test_eviction_cuts_chains_from_the_tail_oldest_first(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    run_alone(kv, request(kv, 0))
    advance(kv, 1000)
    run_alone(kv, request(kv, 1))  # touches 1, 2 later than A's 3, 4
    cached = []
    for _ in range(5):
        assert kv._evict_blocks(1) == 1
        cached.append(sorted(kv.tree.blocks))
    assert cached == [[1, 2, 3, 5], [1, 2, 5], [1, 2], [1], []]
    assert kv.stats.evictions_drop == 5
    assert kv.pool.used_bytes == 0 and kv.pool.conserved()


def test_referenced_prefix_is_never_evicted(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    run_alone(kv, request(kv, 0))
    b = request(kv, 1)
    assert kv.admit(b) == Admit.READY  # B holds 1 and 2
    assert kv._evict_blocks(10) == 2  # only A's tail 4, then 3
    assert sorted(kv.tree.blocks) == [1, 2, 5]


def test_a_block_restores_at_the_cost_of_recomputing_it_at_its_depth(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    run_alone(kv, request(kv, 0))
    fit = kv.fit
    for depth, h in enumerate((1, 2, 3, 4)):
        expected = recompute_us(fit, (depth + 1) * B) - recompute_us(fit, depth * B)
        assert kv.tree.blocks[h].entry.recompute_us == pytest.approx(expected)
    kv._evict_blocks(2)  # 4 and 3 go
    again = request(kv, 0)
    assert kv.admit(again) == Admit.READY
    assert again.kv_source == KvSource.HIT  # 1, 2 reused
    paid = recompute_us(fit, 4 * B) - recompute_us(fit, 2 * B)
    assert again.recompute_us_paid == pytest.approx(paid)
    assert kv.stats.realized_recompute_us == pytest.approx(paid)


def test_whole_replay_conserves_memory_and_keeps_every_cached_parent(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    result = sim.run()
    kv = sim.kv
    assert isinstance(kv, PrefixKvManager)
    assert result.metrics["completed"] == 3
    assert all(
        b.parent is None or b.parent.hash_id in kv.tree.blocks for b in kv.tree.blocks.values()
    )
    assert kv.pool.used_bytes == len(kv.tree.blocks) * kv.hash_bytes  # private pages all freed
