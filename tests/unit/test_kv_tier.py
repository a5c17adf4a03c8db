"""A quantized CPU tier (kv.offload_dtype_bytes): smaller copies, paid conversion, accounting."""

from __future__ import annotations

import pytest

from cachepilot_sim.components.kv import SessionKvManager, Tier, cpu_kv_bytes_per_token
from cachepilot_sim.config import ConfigError, KVConfig, ModelConfig, to_config
from cachepilot_sim.cost import quantize_us
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config


def test_int8_cpu_tier_halves_llama3_8b_kv_plus_one_scale_per_row() -> None:
    m = ModelConfig()  # 32 layers x 8 KV heads x 128 dims, bf16 KV: 131,072 bytes a token
    assert cpu_kv_bytes_per_token(m, 0) == cpu_kv_bytes_per_token(m, 2) == 131_072
    assert cpu_kv_bytes_per_token(m, 1) == 65_536 + 2 * 32 * 4  # 65,792


def test_quantize_time_counts_bytes_read_and_written() -> None:
    assert quantize_us(1000.0, 4096, 2048) == 7  # ceil(6144 / 1000)
    assert quantize_us(1000.0, 0, 0) == 0


def test_offload_dtype_wider_than_the_gpu_kv_is_rejected_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="kv.offload_dtype_bytes"):
        make_sim_config(kv=KVConfig(offload_dtype_bytes=4))


def test_int8_cpu_tier_on_a_prefix_trace_moves_half_the_bytes_per_block() -> None:
    """The prefix manager's CPU tier quantizes blocks too (it was refused before the KV house)."""
    from tests.unit.test_hydra_configs import compose_run

    run = to_config(
        compose_run(
            [
                "+experiment=mooncake_synthetic",
                "vram_gb=16",
                "replay.limit=200",
                "trace.enabled=false",
                "kv.offload_dtype_bytes=1",
            ]
        )
    )
    sim = build(run.sim_for("lru", 0))
    m = sim.run().metrics
    assert m["evictions_offload"] > 0 and m["kv_convert_s"] > 0
    assert m["completed"] + m["rejected"] == 200
    ratio = m["pcie_d2h_gb"] * 1e9 / m["evicted_bytes_offload"]
    assert ratio == pytest.approx(65_792 / 131_072, rel=1e-6)


def test_int8_cpu_tier_moves_half_the_bytes_and_pays_the_conversion() -> None:
    sim = build(make_sim_config(kv=KVConfig(offload_dtype_bytes=1)))
    m = sim.run().metrics
    assert m["evictions_offload"] > 0 and m["reloads"] > 0 and m["kv_convert_s"] > 0
    ratio = m["pcie_d2h_gb"] * 1e9 / m["evicted_bytes_offload"]
    assert ratio == pytest.approx(65_792 / 131_072, rel=0.05)
    kv = sim.kv
    assert isinstance(kv, SessionKvManager)
    on_cpu = [
        s for s in kv.sessions.values() if s.tier in (Tier.CPU, Tier.FLIGHT_OUT, Tier.FLIGHT_IN)
    ]
    assert kv.cpu.used_bytes == sum(s.cpu_bytes for s in on_cpu)
