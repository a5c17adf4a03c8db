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

from cachepilot_sim.components.kv import Admit, PrefixKvManager
from cachepilot_sim.components.request import Request
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from tests.conftest import make_kv as make_kv_for
from tests.conftest import make_sim_config
from tests.property.prefix_checks import check

B = 512

# A request: (an earlier request to extend, modulo their number, or -1; how many of its blocks
# to keep; new blocks).
# Short kept prefixes make chains branch (siblings are where suffix-first eviction can go wrong).
requests_st = st.lists(
    st.tuples(st.integers(-1, 7), st.integers(1, 3), st.integers(0, 3)), min_size=2, max_size=6
)
ops_st = st.lists(
    st.tuples(
        st.sampled_from(["admit", "finish", "admit", "finish", "preempt", "evict"]),
        st.integers(0, 7),
        st.integers(0, 4),
    ),
    min_size=10,
    max_size=60,
)


def chains_of(spec: list[tuple[int, int, int]]) -> list[list[int]]:
    chains: list[list[int]] = []
    next_id = 0
    for parent, keep, new in spec:
        base = chains[parent % len(chains)][:keep] if parent >= 0 and chains else []
        fresh = list(range(next_id, next_id + max(new, 0 if base else 1)))
        next_id += len(fresh)
        chains.append(base + fresh)
    return chains


def make_kv(
    chains: list[list[int]], policy: str, cap: int, folder: Path, cpu_blocks: int = -1
) -> PrefixKvManager:
    """cpu_blocks < 0: no CPU tier; else a CPU store of that many blocks."""
    path = folder / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"timestamp": i, "input_length": B * len(c), "output_length": 40, "hash_ids": c}
            )
            + "\n"
            for i, c in enumerate(chains)
        )
    )
    cfg = make_sim_config(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=65_536),
        policy=policy_config(policy),
        trace=TraceConfig(enabled=False),
        kv=KVConfig(
            offload_enabled=cpu_blocks >= 0, cpu_store_bytes=max(cpu_blocks, 0) * B * 131_072
        ),
        replay=ReplayConfig(
            format=TraceFormat.MOONCAKE, path=str(path), prefix_cache_max_blocks=cap
        ),
    )
    kv = make_kv_for(cfg)
    assert isinstance(kv, PrefixKvManager)
    return kv


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Always tried: two chains branching after block 0, both idle, then cut (a parent with a second
# child must not become evictable).
@example(
    spec=[(-1, 1, 2), (0, 1, 2)],
    ops=[
        ("admit", 0, 0),
        ("finish", 0, 0),
        ("admit", 1, 0),
        ("finish", 1, 0),
        ("evict", 0, 1),
        ("evict", 0, 1),
        ("evict", 0, 4),
    ],
    policy="lru",
    cap=0,
    cpu_blocks=-1,
)
@given(
    spec=requests_st,
    ops=ops_st,
    policy=st.sampled_from(["lru", "perc", "priority"]),
    cap=st.sampled_from([0, 3, 6]),
    cpu_blocks=st.sampled_from([-1, 0, 2, 5, 100]),
)
def test_prefix_cache_invariants_hold_after_every_step(  # noqa: ANN201
    spec,
    ops,
    policy,
    cap,
    cpu_blocks,  # noqa: ANN001
):
    chains = chains_of(spec)
    with tempfile.TemporaryDirectory() as folder:
        kv = make_kv(chains, policy, cap, Path(folder), cpu_blocks)
    reqs: dict[int, Request] = {}
    for op, i, k in ops:
        i %= len(chains)
        kv.env.run(until=kv.env.now + 1000)
        if op == "admit" and i not in reqs:
            req = Request(
                kv.env, i, i, 0, 0, 0, 1, kv.env.now, 10**12, 10**9, 0, B * len(chains[i]), 40
            )
            req.hash_ids = list(chains[i])
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
        if cap and not reqs and not kv.cpu_tier.held:
            assert kv.tree.num_gpu_blocks <= cap
    kv.env.run()  # every copy lands
    check(kv)
