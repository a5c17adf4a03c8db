"""Prefix blocks with a CPU tier: tails go out over PCIe, continuations reload them, a full store
drops, and dropping a GPU tail drops the CPU blocks below it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.components.kv import Admit, PrefixKvManager, Tier
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.cost import recompute_us, transfer_fits, transfer_us
from tests.conftest import make_kv as make_kv_for
from tests.conftest import make_sim_config

B = 512
ROWS = [[1, 2, 3, 4], [1, 2, 3, 4, 5]]  # the second request continues the first


def make_kv(tmp_path: Path, cpu_blocks: int = 100, lru_store: bool = True) -> PrefixKvManager:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"timestamp": i, "input_length": B * len(ids), "output_length": 4, "hash_ids": ids}
            )
            + "\n"
            for i, ids in enumerate(ROWS)
        )
    )
    cfg = make_sim_config(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=65_536),
        policy=policy_config("lru"),
        trace=TraceConfig(enabled=False),
        kv=KVConfig(cpu_store_bytes=cpu_blocks * B * 131_072, cpu_store_evicts_lru=lru_store),
        replay=ReplayConfig(format=TraceFormat.MOONCAKE, path=str(path)),
    )
    kv = make_kv_for(cfg)
    assert isinstance(kv, PrefixKvManager)
    return kv


def request(kv: PrefixKvManager, i: int) -> Request:
    ids = ROWS[i]
    req = Request(kv.env, i, i, 0, 0, 0, 1, int(kv.env.now), 10**12, 10**9, 0, B * len(ids), 4)
    req.hash_ids = list(ids)
    return req


def serve(kv: PrefixKvManager, req: Request) -> None:
    assert kv.admit(req) == Admit.READY
    kv.finish(req, req.prompt_tokens + req.output_tokens)


def test_evicted_tail_goes_to_cpu_and_a_continuation_reloads_it(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    serve(kv, request(kv, 0))
    assert kv._evict_blocks(2) == 2  # 4 then 3 start their copies out
    assert [kv.tree.blocks[h].tier for h in (1, 2, 3, 4)] == [
        Tier.GPU,
        Tier.GPU,
        Tier.FLIGHT_OUT,
        Tier.FLIGHT_OUT,
    ]
    nxt = request(kv, 1)
    assert kv.admit(nxt) == Admit.BLOCKED  # its continuation is still in flight
    kv.env.run()
    assert kv.tree.blocks[3].tier == Tier.CPU and kv.pool.in_flight_bytes == 0
    assert kv.admit(nxt) == Admit.WAIT  # 3 and 4 come back over PCIe
    assert kv.tree.blocks[3].refcount == 1 and 3 not in kv.tree.evictable
    kv.env.run()
    assert kv.admit(nxt) == Admit.READY
    assert nxt.kv_source == KvSource.RELOAD
    h2d = transfer_fits(make_sim_config().hardware)[0]
    expected = transfer_us(h2d, 2 * kv.hash_bytes)
    assert nxt.reload_us_paid == expected == kv.stats.realized_reload_us
    assert nxt.prefill_tokens == B  # only block 5 is computed
    assert (kv.stats.hit_blocks, kv.stats.lookup_blocks, kv.stats.reload_blocks) == (4, 9, 2)
    assert all(kv.tree.blocks[h].refcount == 1 for h in (1, 2, 3, 4, 5))  # held pins released
    assert kv.stats.realized_recompute_us == 0


def test_restore_cost_is_the_cheaper_of_reload_and_recompute(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    serve(kv, request(kv, 0))
    b = kv.tree.blocks[4]
    kv._prepare(b, int(kv.env.now), True)
    recompute = recompute_us(kv.fit, 4 * B) - recompute_us(kv.fit, 3 * B)
    assert b.entry.restore_us == pytest.approx(min(recompute, kv.reload_block_us))
    assert kv.reload_block_us < recompute  # a 64 MiB block: ~1.2 ms over PCIe vs ~13 ms compute


def test_a_full_store_without_lru_drops_the_tail(tmp_path: Path) -> None:
    kv = make_kv(tmp_path, cpu_blocks=1, lru_store=False)
    serve(kv, request(kv, 0))
    kv._evict_blocks(2)  # 4 fits in the store, 3 does not
    kv.env.run()
    assert kv.stats.evictions_offload == 1 and kv.stats.evictions_drop == 1
    assert 3 not in kv.tree.blocks and 4 not in kv.tree.blocks  # 3 dropped with its CPU child 4
    assert kv.cpu.used_bytes == 0 and kv.pool.conserved()


def test_a_full_lru_store_drops_its_oldest_cpu_tail(tmp_path: Path) -> None:
    kv = make_kv(tmp_path, cpu_blocks=1)
    serve(kv, request(kv, 0))
    kv._evict_blocks(1)
    kv.env.run()
    assert kv.tree.blocks[4].tier == Tier.CPU
    kv._evict_blocks(1)  # 3 goes out; the store drops 4 (a CPU tail) to make room
    kv.env.run()
    assert 4 not in kv.tree.blocks and kv.tree.blocks[3].tier == Tier.CPU
    assert kv.stats.cpu_drops == 1 and kv.cpu.used_bytes == kv.hash_bytes


def test_a_request_that_gives_up_after_its_reload_releases_the_pinned_blocks(
    tmp_path: Path,
) -> None:
    """Queue timeout after the reload landed: nothing stays pinned (refcounts as before)."""
    kv = make_kv(tmp_path)
    serve(kv, request(kv, 0))
    assert kv._evict_blocks(2) == 2
    kv.env.run()
    nxt = request(kv, 1)
    assert kv.admit(nxt) == Admit.WAIT
    kv.env.run()
    assert all(kv.tree.blocks[h].refcount == 1 for h in (1, 2, 3, 4))  # pinned for nxt
    kv.abandon(nxt)  # it timed out in the queue instead
    assert nxt.req_id not in kv.cpu_tier.held
    assert all(kv.tree.blocks[h].refcount == 0 for h in (1, 2, 3, 4))
    assert 4 in kv.tree.evictable  # the chain's tail can be evicted again
    assert kv.pool.conserved()
