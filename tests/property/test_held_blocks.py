"""Chained SET decisions while a shared tier holds cut blocks for their writes (ON_EVICTION).

A block the prefix manager evicts while a shared tier writes on eviction stays on the GPU, pinned
and FLIGHT_OUT, until its write lands (`components/kv/remote.py`); it is still its parent's GPU
child, so the forest (the full path) leaves the idle blocks above it out. The indexed paths
(`set_tails.py` for SLRU, ARC and Marconi, `rank_tails.py` for S3-FIFO: `HeldFallback`;
`suffix_tails.py` for T-LRU, which ranks only tails and exposed parents) must decide what the
forest path decides all the same. Checked on random operation streams through the prefix manager
with a store double whose writes land after a delay, once forced onto the forest path.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.property.test_indexed_eviction as driver
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.kv.set_tails import HeldFallback
from cachepilot_sim.config import SimConfig
from cachepilot_sim.policies import KeyScope
from tests.conftest import make_kv
from tests.property.test_indexed_eviction import (
    HASH_TOKENS,
    Op,
    ops_strategy,
    prefix_config,
)

CHAINED = ["slru", "arc", "s3fifo", "marconi", "tlru"]


class WritingStore:
    """A shared store that writes every block it lacks (`SharedKvStore`) and keeps nothing once a
    write has landed (so each eviction of a computed block writes again); it serves no loads.
    A write lands 1..3 s after it starts, by hash, so holds overlap decisions."""

    write_on_eviction = True
    load_when_cheaper = False
    hash_tokens = HASH_TOKENS

    def __init__(self, env: Any) -> None:
        self.env = env
        self.writing: dict[int, None] = {}
        self.num_writes = 0
        self.num_held_decisions = 0  # decisions taken while some block was held (`counted`)

    def holds(self, hash_id: int) -> bool:
        """The store is writing the block."""
        return hash_id in self.writing

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """Nothing to load."""
        return 0

    def load_estimate_us(self, num_blocks: int) -> int:
        """Never asked: nothing is loaded."""
        raise AssertionError("no loads")

    def record_choice(self, req_id: int, num_recomputed: int, recompute_us: float) -> None:
        """Never asked: nothing is loaded."""
        raise AssertionError("no loads")

    def start_load(self, hash_ids: Sequence[int]) -> Any:
        """Never asked: nothing is loaded."""
        raise AssertionError("no loads")

    def store(
        self,
        blocks: Sequence[tuple[int, int, float]],
        landed: Callable[[int], None] | None = None,
    ) -> int:
        """Start a write per block not being written; `landed` runs as each lands."""
        num = 0
        for hash_id, _, _ in blocks:
            if hash_id not in self.writing:
                self.writing[hash_id] = None
                self.env.process(
                    self._write(hash_id, 1_000_000 + hash_id * 7919 % 2_000_000, landed)
                )
                num += 1
        self.num_writes += num
        return num

    def _write(
        self, hash_id: int, delay: int, landed: Callable[[int], None] | None
    ) -> Generator[Any, object, None]:
        yield self.env.timeout(delay)
        del self.writing[hash_id]
        if landed is not None:
            landed(delay)


def _make_kv_with_store(cfg: SimConfig, policy: Any = None, estimator: Any = None) -> Any:
    kv = make_kv(cfg, policy=policy, estimator=estimator)
    store = kv.off_gpu.remote = WritingStore(kv.env)
    kv.writes_evicted = True
    choose = kv._choose

    def counted(num_blocks: int, now: int, allow_offload: bool) -> Any:
        blocks = kv.tree.blocks.values()
        store.num_held_decisions += any(b.refcount and b.tier == Tier.FLIGHT_OUT for b in blocks)
        return choose(num_blocks, now, allow_offload)

    kv._choose = counted
    return kv


def run_held(cfg: SimConfig, full: bool, ops: list[Op], chains: list[list[int]]) -> Any:
    """`test_indexed_eviction.run` with the store double: (results, evictions, kv)."""
    with mock.patch.object(driver, "make_kv", _make_kv_with_store):
        return driver.run(cfg, KeyScope.SET if full else None, ops, chains)


def assert_same_held(cfg: SimConfig, ops: list[Op], chains: list[list[int]]) -> Any:
    fast_out, fast_log, fast = run_held(cfg, False, ops, chains)
    ref_out, ref_log, ref = run_held(cfg, True, ops, chains)
    assert fast_log == ref_log
    assert fast_out == ref_out
    assert vars(fast.stats) == vars(ref.stats)
    return fast


def short_trees(rng: np.random.Generator, num: int = 24) -> list[list[int]]:
    """Chains of at most 5 blocks of a random prefix forest (hash h's parent is a smaller hash or
    none): short enough that a pool of 6-16 blocks takes many of them, and evicts often."""
    parent = [-1] + [int(rng.integers(-1, h)) if rng.random() < 0.5 else -1 for h in range(1, num)]
    chains = []
    for h in range(num):
        path = [h]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        if len(path) <= 5:
            chains.append([100 + x for x in reversed(path)])
    return chains


def short_stream(seed: int) -> tuple[list[Op], list[list[int]]]:
    """400 operations over `short_trees`, from a seed."""
    rng = np.random.default_rng(seed)
    ops = [(int(k), int(a), int(b)) for k, a, b in rng.integers(0, [9, 10**6, 10**6], (400, 3))]
    return ops, short_trees(rng)


def _config(name: str, pool: int, seed: int) -> SimConfig:
    extra = {"slru_protected_fraction": 0.5} if name == "slru" else {}
    return prefix_config(name, pool, 0, seed % 2 == 0, 0.1, **extra)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(CHAINED),
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 4]),
    offload=st.booleans(),
    # Hypothesis's lists (which shrink) or 400 operations from a seed (which hold more often).
    ops=st.one_of(ops_strategy, st.integers(0, 2**32 - 1).map(lambda s: short_stream(s)[0])),
    seed=st.integers(0, 2**32 - 1),
    fraction=st.sampled_from([0.0, 0.5, 0.8]),
)
def test_chained_set_decisions_with_held_blocks_cut_what_the_forest_path_cut(
    policy: str,
    pool: int,
    cpu: int,
    offload: bool,
    ops: list[Op],
    seed: int,
    fraction: float,
) -> None:
    extra = {"slru_protected_fraction": fraction} if policy == "slru" else {}
    chains = short_trees(np.random.default_rng(seed))
    assert_same_held(prefix_config(policy, pool, cpu, offload, 0.1, **extra), ops, chains)


@pytest.mark.parametrize("name", CHAINED)
def test_seeded_streams_with_held_blocks_cut_what_the_forest_path_cut(name: str) -> None:
    """Same victims on 20 seeded streams; some decisions ran while a block was held (those took
    the forest path where the index has the fallback), others on the index."""
    num_held = num_indexed = num_writes = 0
    for seed in range(20):
        kv = assert_same_held(_config(name, 10, seed), *short_stream(seed))
        store = kv.off_gpu.remote
        tails = kv.tails.set_tails or getattr(kv.tails, "suffix_tails", None)
        assert tails is not None
        if isinstance(tails, HeldFallback):
            assert tails.num_full == store.num_held_decisions
        num_held += store.num_held_decisions
        num_indexed += tails.num_visits > 0
        num_writes += store.num_writes
    assert num_held >= 10 and num_indexed >= 15 and num_writes >= 100


@pytest.mark.parametrize("name", ["slru", "arc"])
def test_without_the_fallback_the_index_decides_differently(name: str) -> None:
    """The streams above bite: an index that ignores held blocks counts the idle blocks above
    them (SLRU's room, ARC's T1 bytes and c), and some seeds then evict other blocks."""
    num_differ = 0
    with mock.patch.object(HeldFallback, "note_held", lambda self, hash_id, cur: None):
        for seed in range(20):
            cfg, (ops, chains) = _config(name, 10, seed), short_stream(seed)
            fast, ref = run_held(cfg, False, ops, chains), run_held(cfg, True, ops, chains)
            assert fast[2].tails.set_tails.num_full == 0
            num_differ += fast[1] != ref[1]
    assert num_differ >= 3
