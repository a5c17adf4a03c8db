"""Replay cross-checked against numbers computed independently of the simulator.

With LRU over prefix blocks, a fixed cache size of C blocks and requests that never overlap (one
running sequence at a time, admitted in arrival order), the prefix-hit ratio of the Mooncake sample
equals that of a plain LRU stack of C block ids written here. Blocks of one request are touched
last-to-first, so that within a request the deepest block is the least recent: that is the
suffix-first order of a prefix chain.
"""

from __future__ import annotations

from collections import OrderedDict

import polars as pl
import pytest

from cachepilot_sim.config import (
    BatcherConfig,
    KVConfig,
    ModelConfig,
    OnError,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.sim import build
from cachepilot_sim.workloads.traces import TraceTable, read_trace
from tests.conftest import SAMPLES_DIR, make_sim_config

SAMPLE = "samples:mooncake_synthetic/synthetic_trace.jsonl"


def lru_stack_hits(table: TraceTable, capacity: int) -> tuple[int, int]:
    """(leading-run hits, lookups) of a block LRU stack holding at most `capacity` ids (0: all)."""
    stack: OrderedDict[int, None] = OrderedDict()
    hits = lookups = 0
    for i in range(table.num_requests):
        ids = table.hash_ids(i).tolist()
        run = 0
        while run < len(ids) and ids[run] in stack:
            run += 1
        hits += run
        lookups += len(ids)
        for h in reversed(ids):
            stack[h] = None
            stack.move_to_end(h)
        while capacity and len(stack) > capacity:
            stack.popitem(last=False)
    return hits, lookups


def replay_sequential(capacity: int, policy: str = "lru") -> tuple[dict, pl.DataFrame]:
    cfg = make_sim_config(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=262_144),
        policy=policy_config(policy),
        trace=TraceConfig(enabled=False),
        batcher=BatcherConfig(throughput_max_seqs=1, latency_max_seqs=1),
        kv=KVConfig(offload_enabled=False),  # one tier, as the LRU stack
        replay=ReplayConfig(
            format=TraceFormat.MOONCAKE, path=SAMPLE, prefix_cache_max_blocks=capacity
        ),
    )
    result = build(cfg).run()
    return result.metrics, result.requests


@pytest.fixture(scope="module")
def table() -> TraceTable:
    return read_trace(
        TraceFormat.MOONCAKE,
        SAMPLES_DIR / "mooncake_synthetic" / "synthetic_trace.jsonl",
        OnError.RAISE,
    )


@pytest.mark.parametrize("capacity", [64, 256, 1024])
def test_lru_prefix_hit_ratio_equals_a_plain_lru_stack(table: TraceTable, capacity: int) -> None:
    metrics, requests = replay_sequential(capacity)
    # The precondition of the comparison: every request ran alone and nothing was rejected.
    assert metrics["rejected"] == 0 and metrics["preemptions"] == 0
    order = requests.sort("admitted_us", "request")
    assert order["request"].to_list() == list(range(table.num_requests))
    assert (order["admitted_us"].to_numpy()[1:] >= order["finish_us"].to_numpy()[:-1]).all()
    hits, lookups = lru_stack_hits(table, capacity)
    assert (metrics["prefix_hit_blocks"], metrics["prefix_lookup_blocks"]) == (hits, lookups)
    assert metrics["prefix_hit_ratio"] == pytest.approx(hits / lookups, abs=0)
    assert metrics["prefix_cached_blocks"] <= capacity


def test_the_cross_check_can_tell_cache_sizes_apart(table: TraceTable) -> None:
    ratios = [lru_stack_hits(table, c)[0] / lru_stack_hits(table, c)[1] for c in (64, 1024, 0)]
    assert 0.02 < ratios[0] < ratios[1] <= ratios[2]
