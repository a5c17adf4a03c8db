"""Liveness: every request completes or is rejected with a reason, whatever the memory size.

Regression tests for the deadlock of trace replay under memory pressure (a queued request's own
prefix pinned, the watermark holding back the rest, nothing running: no event could ever free
memory) and for the admission gate reading 0 evictable bytes on traces.
"""

from __future__ import annotations

import pytest

from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.config import to_config
from cachepilot_sim.policies import known_policies
from cachepilot_sim.sim import build
from tests.unit.test_hydra_configs import compose_run

TRACE_EXPERIMENTS = ("mooncake_synthetic", "azure_conv", "azure_code", "sharegpt_poisson")


def assert_every_request_accounted_for(sim_requests: list[Request]) -> None:
    pending = [r.req_id for r in sim_requests if r.outcome == Outcome.PENDING]
    assert not pending
    assert all(r.reject_reason for r in sim_requests if r.outcome == Outcome.REJECTED)


@pytest.mark.parametrize("policy", known_policies())
def test_trace_replay_at_16_gb_finishes_for_every_policy(policy: str) -> None:
    """The shipped Mooncake sample at 16 GB stopped with 38-41 requests never finished."""
    run = to_config(
        compose_run(
            [
                "+experiment=mooncake_synthetic",
                "vram_gb=16",
                "replay.limit=300",
                "trace.enabled=false",
            ]
        )
    )
    sim = build(run.sim_for(policy, 0))
    metrics = sim.run().metrics  # raises SimulationError on a deadlock
    assert metrics["completed"] + metrics["rejected"] == 300
    assert metrics["completed"] > 250
    assert_every_request_accounted_for(sim.clients.requests)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", TRACE_EXPERIMENTS)
@pytest.mark.parametrize("offload", ["true", "false"])
def test_trace_experiments_finish_at_every_vram_size(experiment: str, offload: str) -> None:
    """From just above the weights (8.03 GB + 1 GiB reserve + 64 blocks) up."""
    for vram_gb in (9.3, 10.0, 12.0, 16.0, 24.0):
        run = to_config(
            compose_run(
                [
                    f"+experiment={experiment}",
                    f"vram_gb={vram_gb}",
                    "replay.limit=150",
                    "trace.enabled=false",
                    f"kv.offload_enabled={offload}",
                ]
            )
        )
        sim = build(run.sim_for("lru", 0))
        metrics = sim.run().metrics
        assert metrics["completed"] + metrics["rejected"] == 150, vram_gb
        assert_every_request_accounted_for(sim.clients.requests)


def test_admission_gate_sees_the_idle_prefix_blocks_of_a_trace() -> None:
    """The gate read 0 evictable bytes on traces (the prefix manager never filled the state the
    inherited method summed), so its evictable-fraction feature was always 0."""
    run = to_config(
        compose_run(
            [
                "+experiment=mooncake_synthetic",
                "replay.limit=60",
                "trace.enabled=false",
                "admission=threshold",
            ]
        )
    )
    sim = build(run.sim_for("lru", 0))
    sim.run()
    gate = sim.batcher.gate
    assert gate is not None
    idle_blocks = sum(1 for b in sim.kv.tree.blocks.values() if b.refcount == 0 and b.tier == 0)  # type: ignore[attr-defined]
    assert idle_blocks > 0
    probe = sim.clients.requests[-1]
    view = gate.view(probe)
    assert view.evictable_bytes == idle_blocks * sim.kv.hash_bytes  # type: ignore[attr-defined]
    assert view.evictable_bytes <= view.held_bytes
