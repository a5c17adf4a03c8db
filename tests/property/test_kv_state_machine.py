"""Stateful hypothesis test of the KV manager and VRAM pool against their invariants.

Every KV byte is free, used or in flight (never two); a session's KV sits on exactly one tier and
the tier indexes agree with it; pinned weights never change; CPU bytes match CPU-side sessions.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.kv_manager import Admit, KvManager, Tier
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import HardwareConfig, KVConfig, ModelConfig, policy_config
from cachepilot_sim.cost import compute_fit, transfer_fits
from cachepilot_sim.policies import GapEstimator, make_policy
from cachepilot_sim.trace.recorder import TraceRecorder
from tests.conftest import make_sim_config

NUM_SESSIONS = 12


class KvMachine(RuleBasedStateMachine):
    hardware = HardwareConfig()

    def __init__(self) -> None:
        super().__init__()
        model = ModelConfig(weight_bytes=1_000_000_000, num_layers=4, max_context_tokens=4096)
        block = model.kv_bytes_per_token * 16
        kv = KVConfig(
            activation_reserve_bytes=0, cpu_store_bytes=40 * block, watermark_fraction=0.05
        )
        cfg = make_sim_config(
            model=model, kv=kv, vram_gb=(1e9 + 100 * block) / 1e9, hardware=self.hardware
        )
        self.env = SimEnvironment()
        self.pool = VramPool(cfg)
        self.weights = self.pool.pinned_weight_bytes
        h2d, d2h = transfer_fits(cfg.hardware)
        est = GapEstimator(0.3, 20e6, 30e6)
        self.kv = KvManager(
            self.env,
            cfg,
            self.pool,
            PcieLink(self.env, h2d, d2h),
            make_policy(policy_config("perc"), est),
            est,
            compute_fit(cfg.hardware),
            TraceRecorder(),
        )
        self.handed_back: list[Request] = []
        self.kv.on_ready = self.handed_back.append
        self.running: dict[int, tuple[Request, int, int]] = {}  # session -> (req, tokens, blocks)
        self.outstanding: set[int] = set()
        self.context = [0] * NUM_SESSIONS
        self.turns = [0] * NUM_SESSIONS
        self.next_req = 0

    def _request(self, sid: int, prompt: int) -> Request:
        self.next_req += 1
        return Request(
            self.env,
            self.next_req,
            sid,
            self.turns[sid],
            0,
            0,
            1,
            self.env.now,
            self.env.now + 1,
            1,
            self.context[sid],
            prompt,
            8,
        )

    def _admit(self, req: Request) -> None:
        result = self.kv.admit(req)
        if result == Admit.READY:
            tokens = req.context_tokens + req.prompt_tokens
            self.running[req.session_id] = (req, tokens, self.kv.blocks_for(tokens))
        elif result in (Admit.BLOCKED, Admit.REJECT):
            self.outstanding.discard(req.session_id)
        # WAIT: the manager hands it back through on_ready

    @rule(sid=st.integers(0, NUM_SESSIONS - 1), prompt=st.integers(1, 600))
    def arrive(self, sid: int, prompt: int) -> None:
        if sid in self.outstanding:
            return
        self.outstanding.add(sid)
        req = self._request(sid, prompt)
        self.kv.on_arrival(req)
        self._admit(req)

    @precondition(lambda self: self.handed_back)
    @rule()
    def readmit(self) -> None:
        self._admit(self.handed_back.pop(0))

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 10**6))
    def grow(self, pick: int) -> None:
        sid = sorted(self.running)[pick % len(self.running)]
        req, tokens, blocks = self.running[sid]
        if tokens + 1 > blocks * 16:
            if not self.kv.grow([sid], [1]):
                return
            blocks += 1
        self.running[sid] = (req, tokens + 1, blocks)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 10**6), preempt=st.booleans())
    def leave(self, pick: int, preempt: bool) -> None:
        sid = sorted(self.running)[pick % len(self.running)]
        req, tokens, blocks = self.running.pop(sid)
        self.outstanding.discard(sid)
        if preempt:
            self.kv.preempt(req, tokens)
        else:
            assert self.kv.sessions[sid].num_blocks == blocks
            self.kv.finish(req, tokens)
            self.context[sid] = tokens
            self.turns[sid] += 1

    @rule(dt=st.integers(1, 5_000))
    def advance(self, dt: int) -> None:
        self.env.run(until=self.env.now + dt)

    @rule()
    def watermark(self) -> None:
        self.kv.maintain_watermark()

    @invariant()
    def bytes_are_conserved(self) -> None:
        assert self.pool.conserved()
        assert self.pool.pinned_weight_bytes == self.weights

    @invariant()
    def tiers_agree_with_pool_and_indexes(self) -> None:
        by_tier = {t: 0 for t in Tier}
        for s in self.kv.sessions.values():
            by_tier[s.tier] += s.num_bytes
            assert (s.entry.entry_id in self.kv.idle) == (s.tier == Tier.GPU and not s.active)
            assert (s.entry.entry_id in self.kv.cpu_lru) == (s.tier == Tier.CPU)
            if s.tier == Tier.NONE:
                assert s.num_blocks == 0
        assert by_tier[Tier.GPU] == self.pool.used_bytes
        assert by_tier[Tier.FLIGHT_IN] + by_tier[Tier.FLIGHT_OUT] == self.pool.in_flight_bytes
        cpu_side = by_tier[Tier.CPU] + by_tier[Tier.FLIGHT_OUT] + by_tier[Tier.FLIGHT_IN]
        assert cpu_side == self.kv.cpu_used_bytes <= self.kv.cpu_capacity_bytes


KvMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
TestKvManagerInvariants = KvMachine.TestCase


class ReferenceHardwareKvMachine(KvMachine):
    """The machine with the transfer times the failing sequence below was found with."""

    hardware = HardwareConfig(
        name="h200_reference",
        hbm_bytes_per_us=4.196e6,
        prefill_token_us=25.97,
        attention_token2_us=9.47e-4,
        step_overhead_us=0.0,
        pcie_h2d_latency_us=9.0,
        pcie_h2d_bytes_per_us=55.2e3,
        pcie_d2h_latency_us=9.0,
        pcie_d2h_bytes_per_us=55.0e3,
    )


def test_reload_making_room_never_drops_its_own_cpu_copy() -> None:
    """Found by the machine above: a returning session's reload evicts an idle victim to the CPU
    store, which was full, and the store's LRU drop picked the returning session's own copy
    (KeyError in _start_reload). The store must keep the KV that is about to come back."""
    state = ReferenceHardwareKvMachine()
    for sid, prompt in ((0, 128), (5, 398), (4, 417)):
        state.arrive(prompt=prompt, sid=sid)
    for _ in range(3):
        state.leave(pick=0, preempt=False)
    state.arrive(prompt=97, sid=0)
    state.arrive(prompt=275, sid=5)
    state.leave(pick=0, preempt=False)
    for _ in range(3):
        state.watermark()
    state.leave(pick=0, preempt=False)
    state.arrive(prompt=161, sid=1)
    state.arrive(prompt=1, sid=4)
    state.advance(dt=139)  # session 4's KV lands in the full CPU store; its turn is handed back
    state.arrive(prompt=401, sid=1)
    state.readmit()  # session 4 reloads: making room must not drop session 4's own CPU copy
    state.bytes_are_conserved()
    state.tiers_agree_with_pool_and_indexes()
