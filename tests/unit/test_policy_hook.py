"""The policy hook (experiments/validation/policy_hook.py) in transformers 5.17 continuous batching
on the CPU with a tiny random model: `mru` is the engine's own order while no prefix branches,
`lru` reuses other blocks, every hooked policy cuts chain tails only.

Skipped when transformers 5.17 is not importable (CI has none). To run:
    pip install --no-deps --target /work/tfsite transformers==5.17.0
    PYTHONPATH=/work/tfsite:$PWD pytest tests/unit/test_policy_hook.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[2] / "experiments/validation"
sys.path.insert(0, str(HERE))

from policy_hook import Counters, PolicyHook  # noqa: E402


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
