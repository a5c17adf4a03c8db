"""The policy hook (experiments/validation/policy_hook.py) in transformers 5.17 continuous batching
on the CPU with a tiny random model: `mru` is the engine's own order while no prefix branches,
`lru` reuses other blocks, every hooked policy cuts chain tails only.

Skipped when transformers 5.17 is not importable (CI has none). To run:
    pip install --no-deps --target /work/tfsite transformers==5.17.0
    PYTHONPATH=/work/tfsite:$PWD pytest tests/unit/test_policy_hook.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[2] / "experiments/validation"
sys.path.insert(0, str(HERE))

from policy_hook import Counters, Mirror, PolicyHook  # noqa: E402

from cachepilot_sim.components.kv.forest import PrefixTree  # noqa: E402


def test_an_unknown_policy_fails_before_any_engine_is_built() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'belady2'.*'lru'"):
        PolicyHook("belady2")
    assert PolicyHook("none").stats()["policy"] == "none"  # the engine's own: nothing imported


def test_counters_see_an_inner_eviction_and_held_blocks_missed() -> None:
    c = Counters()
    c.registered(1, None)
    c.registered(2, 1)
    c.evicted(1)  # block 2 extends it: inner
    c.evicted(2)
    c.lookup("r", [1, 2, 3], 0)
    c.lookup("r", [1, 2, 3], 0)  # a soft reset's second lookup is not a new request
    v = c.values
    assert (v["inner_evictions"], v["evictions"], v["recomputed_blocks"], v["lookups"]) == (
        1,
        2,
        2,
        1,
    )


def grow(m: Mirror, tree: PrefixTree, chains: list[list[int]], group: int, t: int) -> int:
    """Cache `chains` (hash ids root first, sharing prefixes) in the mirror and in the simulator's
    own `PrefixTree`, then release every block, one request per chain, in order."""
    from cachepilot_sim.components.kv.forest import HashBlock

    for chain in chains:
        for depth, h in enumerate(chain):
            if h in m.blocks:
                m.pinned(h)
                tree.pin(tree.blocks[h])
                continue
            parent = chain[depth - 1] if depth else None
            m.registered(h, parent, depth, group, t)
            pb = tree.blocks[parent] if parent is not None else None
            tree.add(HashBlock(h, pb, m.entries[h]))
    for chain in chains:
        for h in chain:
            t += 1
            m.released(h, group, t)  # the entry is shared: the tree reads the same one
            tree.unpin(tree.blocks[h])
    return t


@pytest.mark.parametrize("policy", ["mru", "lru", "lfu", "perc", "s3fifo"])
def test_mirror_decisions_are_the_prefix_managers_forest_path(policy: str) -> None:
    from cachepilot_sim.components.kv.forest import PrefixTree

    m, tree = Mirror(policy, 256, 1 << 25), PrefixTree()
    t = grow(m, tree, [[1, 2, 3, 4], [1, 2, 5], [1, 2, 6, 7]], 0, 0)
    t = grow(m, tree, [[10, 11, 12]], 1, t + 1_000_000)
    t = grow(m, tree, [[1, 2, 3, 4, 8]], 0, t + 5_000_000)
    forest = tree.forest()
    entries = [m._prepare(b) for b in forest.blocks]
    want = forest.cut_order(
        m.policy.select_victims(entries, 6 * m.block_bytes, t, forest.chains, forest.parents),
        policy,
    )
    got = m.choose(6, t)
    assert got == [b.hash_id for b in want]
    assert len(got) == 6 and all(h not in m.blocks for h in got)
    for h in m.blocks:  # what is left is closed under parents
        b = m.blocks[h]
        assert b.parent is None or b.parent.hash_id in m.blocks


def test_the_hook_needs_neither_polars_nor_hydra(tmp_path: Path) -> None:
    """The lent GPUs have no polars, hydra or omegaconf: the mirror must not import them."""
    code = (
        "import sys\n"
        "for name in ('polars', 'hydra', 'omegaconf', 'pyarrow'):\n"
        "    sys.modules[name] = None\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "from policy_hook import Mirror\n"
        "for p in ('mru', 'lru', 'lfu', 'perc', 's3fifo'):\n"
        "    m = Mirror(p, 256, 1)\n"
        "    m.registered(1, None, 0, 0, 0); m.registered(2, 1, 1, 0, 1)\n"
        "    m.released(1, 0, 2); m.released(2, 0, 3)\n"
        "    assert m.choose(1, 4) == [2], p\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(HERE.parents[1])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the hook drives its engine)"
    )
    if not transformers.__version__.startswith("5.17"):
        pytest.skip(
            f"the hook wraps transformers 5.17's block manager, not {transformers.__version__}"
        )
    import policy_hook_check as check
    from hf_engine import destroy_engine

    mgr, _ = check.build_engine(num_blocks=24)
    yield check.Driver(mgr)
    destroy_engine(mgr)


def test_mru_hook_reproduces_the_engine_run_exactly(driver: Any) -> None:
    import policy_hook_check as check

    res = check.check_identity(driver)
    assert res["evictions"][0] > 10  # the workload does reuse cached blocks
    for key in ("same_allocations", "same_prefix_hits", "same_batches", "same_tokens"):
        assert res[key], key


def test_lru_reuses_the_older_session_and_mru_the_newer(driver: Any) -> None:
    import policy_hook_check as check

    res = check.check_lru(driver)
    assert res["mru_hits"] == {"a1": 96, "b1": 0}
    assert res["lru_hits"] == {"a1": 0, "b1": 96}


def test_hooked_policies_cut_tails_only_where_the_engine_evicts_inner_blocks(
    driver: Any,
) -> None:
    import policy_hook_check as check

    res = check.check_branching(driver)
    assert res["none"]["inner_evictions"] > 0
    for policy, row in res.items():
        if policy != "none":
            assert row["inner_evictions"] == 0, policy
            assert row["s3_hit"] == 128, policy  # the system prompt's 4 blocks stayed whole
