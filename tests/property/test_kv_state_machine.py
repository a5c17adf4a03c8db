"""Stateful hypothesis tests of both KV managers and the VRAM pool against their invariants.

Conservation: every KV byte is free, used or in flight (never two); a unit of KV (a session's, a
prefix block) sits on exactly one tier and the indexes agree with it; pinned weights never change;
the CPU store's bytes match what sits on it (in its quantized form for an INT8 tier). Liveness: a
request at the head of the queue is never BLOCKED while nothing runs and nothing is in flight, since
then no event could ever free memory. Each machine draws its configuration (pool and CPU store
size, watermark, policy, offload on/off, KV tier) in its `initialize` rule, the policy from the
list that the test is parametrized with: every registered policy but the oracle, and the
caching-literature baselines again on their own, so that each of them gets a whole step budget
rather than a share of the draw over every policy.

Steps: `CACHEPILOT_FUZZ_STEPS` per machine and policy list (default 50,000, which CI runs);
`make test-fuzz` runs 10^6 each (a nightly-size run).
"""

from __future__ import annotations

import os
from collections import deque

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cachepilot_sim.components.kv import Admit, PrefixKvManager, SessionKvManager, Tier
from cachepilot_sim.components.request import Request
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    SimConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.policies import known_policies
from tests.conftest import make_kv, make_sim_config
from tests.property.prefix_checks import check

STEPS = int(os.environ.get("CACHEPILOT_FUZZ_STEPS", "50000"))
STEPS_PER_EXAMPLE = 100
NUM_SESSIONS = 12
POLICY_LISTS = {
    # Every registered policy but the exact oracle (a MILP per decision; its liveness is covered
    # by the whole-simulation tests in tests/scenario/test_liveness.py).
    "all": [p for p in known_policies() if p != "oracle"],
    # The caching-literature baselines on their own: a whole budget each, not a share of "all".
    "baselines": ["s3fifo", "sieve", "lrb"],
}
MODEL = ModelConfig(weight_bytes=1_000_000_000, num_layers=4, max_context_tokens=65_536)


def machine_settings() -> settings:
    return settings(
        max_examples=max(1, STEPS // STEPS_PER_EXAMPLE),
        stateful_step_count=STEPS_PER_EXAMPLE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class QueueMachine(RuleBasedStateMachine):
    """The engine's queue discipline around a KV manager: handed-back requests first, then
    arrivals in order; a BLOCKED head stops admission until something changes."""

    kv: SessionKvManager | PrefixKvManager

    def __init__(self, policies: list[str]) -> None:
        super().__init__()
        self.policies = policies

    def setup(self, cfg: SimConfig) -> None:
        self.kv = make_kv(cfg)
        self.weights = 1_000_000_000
        self.queue: deque[Request] = deque()
        self.running: dict[int, tuple[Request, int, int]] = {}  # key -> (req, tokens, blocks)
        self.next_req = 0

    def engine_idle(self) -> bool:
        return not self.running and self.kv.pool.in_flight_bytes == 0

    def on_ready(self, req: Request) -> None:
        """Hook: a request became running."""

    @rule()
    def admit_next(self) -> None:
        handed = self.kv.queue.handed_back  # type: ignore[attr-defined]
        while handed:  # a request whose KV landed goes before everything else
            self.queue.appendleft(handed.pop())
        if not self.queue:
            return
        req = self.queue[0]
        result = self.kv.admit(req)
        if result in (Admit.BLOCKED, Admit.BLOCKED_HIT):
            # Waiting is fine while something runs or a copy (maybe started just now) is in
            # flight: either will wake the engine. Otherwise nothing ever would.
            assert not self.engine_idle(), "BLOCKED with nothing running or in flight: a deadlock"
            return
        self.queue.popleft()
        if result == Admit.READY:
            tokens = req.context_tokens + req.prompt_tokens
            self.running[req.session_id] = (req, tokens, self.kv.blocks_for(tokens))
            self.on_ready(req)
        elif result == Admit.REJECT:
            self.on_done(req)
        # WAIT: the manager hands it back through its queue when the copy lands

    def on_done(self, req: Request) -> None:
        """Hook: the request left for good (finished or rejected)."""

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 10**6))
    def grow(self, pick: int) -> None:
        key = sorted(self.running)[pick % len(self.running)]
        req, tokens, blocks = self.running[key]
        if tokens + 1 > blocks * self.kv.block_tokens:
            if not self.kv.grow([key], [1]):
                return
            blocks += 1
        self.running[key] = (req, tokens + 1, blocks)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 10**6), preempt=st.booleans())
    def leave(self, pick: int, preempt: bool) -> None:
        key = sorted(self.running)[pick % len(self.running)]
        req, tokens, _ = self.running.pop(key)
        if preempt:
            self.kv.preempt(req, tokens)
            self.queue.appendleft(req)  # as the batcher does: preempted requests go first
        else:
            self.kv.finish(req, tokens)
            self.on_done(req)

    @rule(dt=st.integers(1, 5_000))
    def advance(self, dt: int) -> None:
        self.kv.env.run(until=self.kv.env.now + dt)

    @rule()
    def watermark(self) -> None:
        self.kv.maintain_watermark()

    @invariant()
    def bytes_are_conserved(self) -> None:
        if hasattr(self, "kv"):
            assert self.kv.pool.conserved()
            assert self.kv.pool.pinned_weight_bytes == self.weights


class SessionKvMachine(QueueMachine):
    @initialize(
        pool_blocks=st.sampled_from([66, 100, 200]),
        cpu_blocks=st.sampled_from([0, 10, 40, 400]),
        watermark=st.sampled_from([0.0, 0.05, 0.2, 0.45]),
        data=st.data(),
        offload=st.booleans(),
        int8_cpu=st.booleans(),
        lru_store=st.booleans(),
    )
    def build(
        self,
        pool_blocks: int,
        cpu_blocks: int,
        watermark: float,
        data: st.DataObject,
        offload: bool,
        int8_cpu: bool,
        lru_store: bool,
    ) -> None:
        block = MODEL.kv_bytes_per_token * 16
        kv = KVConfig(
            activation_reserve_bytes=0,
            cpu_store_bytes=cpu_blocks * block,
            watermark_fraction=watermark,
            offload_enabled=offload,
            offload_dtype_bytes=1 if int8_cpu else 0,
            cpu_store_evicts_lru=lru_store,
        )
        self.setup(
            make_sim_config(
                model=MODEL,
                kv=kv,
                policy=policy_config(data.draw(st.sampled_from(self.policies), "policy")),
                vram_gb=(1e9 + pool_blocks * block) / 1e9,
            )
        )
        self.outstanding: set[int] = set()
        self.context = [0] * NUM_SESSIONS
        self.turns = [0] * NUM_SESSIONS

    @rule(sid=st.integers(0, NUM_SESSIONS - 1), prompt=st.integers(1, 1200))
    def arrive(self, sid: int, prompt: int) -> None:
        if sid in self.outstanding:
            return
        self.outstanding.add(sid)
        self.next_req += 1
        now = self.kv.env.now
        req = Request(
            self.kv.env,
            self.next_req,
            sid,
            self.turns[sid],
            0,
            0,
            1,
            now,
            now + 1,
            1,
            self.context[sid],
            prompt,
            8,
        )
        self.kv.on_arrival(req)
        self.queue.append(req)

    def on_done(self, req: Request) -> None:
        self.outstanding.discard(req.session_id)
        if (
            req.session_id in self.kv.sessions
            and self.kv.sessions[req.session_id].tier != Tier.NONE
        ):
            s = self.kv.sessions[req.session_id]
            self.context[req.session_id] = s.entry.num_tokens or self.context[req.session_id]
            self.turns[req.session_id] += 1

    def on_ready(self, req: Request) -> None:
        s = self.kv.sessions[req.session_id]
        assert s.active and s.tier == Tier.GPU

    @invariant()
    def tiers_agree_with_pool_and_indexes(self) -> None:
        if not hasattr(self, "kv"):
            return
        kv = self.kv
        assert isinstance(kv, SessionKvManager)
        by_tier = {t: 0 for t in Tier}
        cpu_side = 0
        for s in kv.sessions.values():
            by_tier[s.tier] += s.num_bytes
            assert (s.entry.entry_id in kv.idle) == (s.tier == Tier.GPU and not s.active)
            if s.tier == Tier.NONE:
                assert s.num_blocks == 0
            if s.tier in (Tier.CPU, Tier.FLIGHT_OUT, Tier.FLIGHT_IN):
                cpu_side += s.cpu_bytes
        assert by_tier[Tier.GPU] == kv.pool.used_bytes
        assert by_tier[Tier.FLIGHT_IN] + by_tier[Tier.FLIGHT_OUT] == kv.pool.in_flight_bytes
        assert cpu_side == kv.cpu.used_bytes <= kv.cpu.capacity_bytes
        assert kv.evictable_bytes() == sum(s.num_bytes for s in kv.idle.values())
        assert kv.num_active == sum(s.active for s in kv.sessions.values()) == len(self.running)


HASH_TOKENS = 512
CHAINS = [
    [1, 2, 3, 4],
    [1, 2, 3, 4, 5, 6],
    [1, 2, 7],
    [8],
    [8, 9, 10],
    [1, 2, 3, 4, 5, 11],
    [12, 13, 14, 15, 16, 17, 18, 19],
    [8, 9, 20],
]


class PrefixKvMachine(QueueMachine):
    @initialize(
        pool_hash_blocks=st.sampled_from([10, 16, 40]),
        cpu_blocks=st.sampled_from([0, 2, 6, 100]),
        watermark=st.sampled_from([0.0, 0.05, 0.2, 0.45]),
        data=st.data(),
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
        data: st.DataObject,
        offload: bool,
        int8_cpu: bool,
        lru_store: bool,
        cap: int,
    ) -> None:
        hash_bytes = MODEL.kv_bytes_per_token * HASH_TOKENS
        kv = KVConfig(
            activation_reserve_bytes=0,
            cpu_store_bytes=cpu_blocks * hash_bytes,
            watermark_fraction=watermark,
            offload_enabled=offload,
            offload_dtype_bytes=1 if int8_cpu else 0,
            cpu_store_evicts_lru=lru_store,
        )
        replay = ReplayConfig(
            format=TraceFormat.MOONCAKE, path="unused.jsonl", prefix_cache_max_blocks=cap
        )
        self.setup(
            make_sim_config(
                model=MODEL,
                kv=kv,
                policy=policy_config(data.draw(st.sampled_from(self.policies), "policy")),
                trace=TraceConfig(enabled=False),
                replay=replay,
                vram_gb=(1e9 + pool_hash_blocks * hash_bytes) / 1e9,
            )
        )
        self.in_system: set[int] = set()

    @rule(chain=st.integers(0, len(CHAINS) - 1), output=st.integers(1, 600))
    def arrive(self, chain: int, output: int) -> None:
        self.next_req += 1
        ids = CHAINS[chain]
        req = Request(
            self.kv.env,
            self.next_req,
            self.next_req,
            0,
            0,
            0,
            1,
            self.kv.env.now,
            10**12,
            10**9,
            0,
            HASH_TOKENS * len(ids),
            output,
        )
        req.hash_ids = list(ids)
        req.group_id = chain
        self.kv.on_arrival(req)
        self.queue.append(req)

    @invariant()
    def prefix_tree_agrees_with_pool_and_store(self) -> None:
        if not hasattr(self, "kv"):
            return
        assert isinstance(self.kv, PrefixKvManager)
        check(self.kv)


@pytest.mark.parametrize("policies", list(POLICY_LISTS.values()), ids=list(POLICY_LISTS))
@pytest.mark.parametrize("machine", [SessionKvMachine, PrefixKvMachine], ids=["session", "prefix"])
def test_kv_manager_keeps_its_invariants(machine: type[QueueMachine], policies: list[str]) -> None:
    run_state_machine_as_test(lambda: machine(policies), settings=machine_settings())
