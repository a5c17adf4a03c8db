"""Factories for real config and simulation objects (no mocks): make_*(**overrides)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    PolicyConfig,
    SimConfig,
    WorkloadClass,
    WorkloadConfig,
)

# Trace experiments read $CACHEPILOT_TRACES_DIR; tests use the shipped samples (same layout), so
# they run the same on a clone without the full traces.
SAMPLES_DIR = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "workloads" / "samples"
os.environ["CACHEPILOT_TRACES_DIR"] = str(SAMPLES_DIR)

MIXED = {
    "chat": dict(
        share=0.4,
        prompt_tokens_mean=256,
        output_tokens_mean=192,
        tpot_slo_ms=28,
        priority=3,
        turns_mean=5,
        think_time_mean_s=20,
    ),
    "code": dict(
        share=0.3,
        prompt_tokens_mean=512,
        output_tokens_mean=256,
        tpot_slo_ms=36,
        priority=2,
        turns_mean=4,
        think_time_mean_s=30,
    ),
    "summarize": dict(
        share=0.2,
        prompt_tokens_mean=1024,
        output_tokens_mean=128,
        tpot_slo_ms=25,
        ttft_slo_ms=4000,
        priority=1,
        turns_mean=2,
        think_time_mean_s=45,
    ),
    "longctx": dict(
        share=0.1,
        prompt_tokens_mean=8192,
        output_tokens_mean=512,
        tpot_slo_ms=55,
        ttft_slo_ms=10000,
        priority=0,
        turns_mean=3,
        think_time_mean_s=60,
    ),
}


def make_workload(**overrides: Any) -> WorkloadConfig:
    values: dict[str, Any] = dict(
        name="mixed",
        classes={k: WorkloadClass(**v) for k, v in MIXED.items()},
        num_requests=120,
        session_rate_per_s=0.5,
        spike_multiplier=4.0,
        spike_at_request=40,
        max_active_sessions=16,
    )
    values.update(overrides)
    return WorkloadConfig(**values)


def make_sim_config(**overrides: Any) -> SimConfig:
    """A small mixed-spike simulation; keyword overrides replace whole sections or fields."""
    values: dict[str, Any] = dict(
        seed=0,
        vram_gb=16.0,
        workload=make_workload(),
        model=ModelConfig(max_context_tokens=32768),
        kv=KVConfig(),
        policy=PolicyConfig(),
    )
    values.update(overrides)
    return SimConfig(**values)


@pytest.fixture
def sim_config() -> SimConfig:
    return make_sim_config()
