"""The KV state machines (tests/property/test_kv_state_machine.py: bytes conserved, every tier
accounted for) run with the caching-literature baselines only, so that each of them gets the
full step budget rather than a share of the draw over every registered policy."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize

from tests.property import test_kv_state_machine as machines

NEW_POLICIES = ["s3fifo", "sieve", "lrb"]


class BaselineSessionKvMachine(machines.SessionKvMachine):
    @initialize(
        pool_blocks=st.sampled_from([66, 100, 200]),
        cpu_blocks=st.sampled_from([0, 10, 40, 400]),
        watermark=st.sampled_from([0.0, 0.05, 0.2, 0.45]),
        policy=st.sampled_from(NEW_POLICIES),
        offload=st.booleans(),
        int8_cpu=st.booleans(),
        lru_store=st.booleans(),
    )
    def build(
        self,
        pool_blocks: int,
        cpu_blocks: int,
        watermark: float,
        policy: str,
        offload: bool,
        int8_cpu: bool,
        lru_store: bool,
    ) -> None:
        super().build(pool_blocks, cpu_blocks, watermark, policy, offload, int8_cpu, lru_store)


class BaselinePrefixKvMachine(machines.PrefixKvMachine):
    @initialize(
        pool_hash_blocks=st.sampled_from([10, 16, 40]),
        cpu_blocks=st.sampled_from([0, 2, 6, 100]),
        watermark=st.sampled_from([0.0, 0.05, 0.2, 0.45]),
        policy=st.sampled_from(NEW_POLICIES),
        offload=st.booleans(),
        int8_cpu=st.booleans(),
        lru_store=st.booleans(),
        cap=st.sampled_from([0, 6]),
    )
    def build(
        self,
        pool_hash_blocks: int,
        cpu_blocks: int,
        watermark: float,
        policy: str,
        offload: bool,
        int8_cpu: bool,
        lru_store: bool,
        cap: int,
    ) -> None:
        super().build(
            pool_hash_blocks, cpu_blocks, watermark, policy, offload, int8_cpu, lru_store, cap
        )


BaselineSessionKvMachine.TestCase.settings = machines.machine_settings()
TestBaselineSessionKvManager = BaselineSessionKvMachine.TestCase
BaselinePrefixKvMachine.TestCase.settings = machines.machine_settings()
TestBaselinePrefixKvManager = BaselinePrefixKvMachine.TestCase
