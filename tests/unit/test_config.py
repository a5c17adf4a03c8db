from __future__ import annotations

import pytest

from cachepilot_sim.config import (
    ConfigError,
    KVConfig,
    ModelConfig,
    PolicyConfig,
    WorkloadClass,
)
from tests.conftest import make_sim_config, make_workload


def test_negative_capacity_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"kv\.cpu_store_bytes.*-1"):
        KVConfig(cpu_store_bytes=-1)


def test_negative_vram_names_the_key() -> None:
    with pytest.raises(ConfigError, match="vram_gb"):
        make_sim_config(vram_gb=-16.0)


def test_class_shares_must_sum_to_one() -> None:
    classes = {"a": WorkloadClass(share=0.5), "b": WorkloadClass(share=0.4)}
    with pytest.raises(ConfigError, match=r"workload\.classes\.\*\.share.*sum to 1"):
        make_workload(classes=classes)


def test_bad_class_field_names_class_and_field() -> None:
    with pytest.raises(ConfigError, match=r"workload\.classes\.chat\.prompt_tokens_mean"):
        make_workload(classes={"chat": WorkloadClass(prompt_tokens_mean=0)})


def test_unknown_policy_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"policy\.name.*'fifo2'.*known: \[.*'lru'.*'perc'"):
        PolicyConfig(name="fifo2")


def test_model_that_does_not_fit_vram_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot hold the model"):
        make_sim_config(model=ModelConfig(name="big", weight_bytes=16_060_000_000))


def test_class_pointing_at_unknown_model_is_refused() -> None:
    wl = make_workload(classes={"chat": WorkloadClass(model="nope")})
    with pytest.raises(ConfigError, match=r"workload\.classes\.chat\.model"):
        make_sim_config(workload=wl)


def test_config_is_read_only_after_validation() -> None:
    cfg = make_sim_config()
    with pytest.raises(AttributeError, match="read-only"):
        cfg.vram_gb = 80.0  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        cfg.kv.block_tokens = 32  # type: ignore[misc]


def test_kv_pool_is_vram_minus_weights_minus_reserve() -> None:
    cfg = make_sim_config()
    expected = 16_000_000_000 - cfg.model.weight_bytes - cfg.kv.activation_reserve_bytes
    assert cfg.kv_pool_bytes == expected
    assert cfg.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB for Llama-3-8B bf16 KV
