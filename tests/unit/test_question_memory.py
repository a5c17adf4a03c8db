"""The question lines name what sizes the KV pool: an engine profile's own pool is not vram_gb."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.config.question import kv_memory, serving_setup

register_configs()


def _cfg(overrides: list[str]):  # noqa: ANN202
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=overrides))


def test_an_engine_pool_is_named_instead_of_vram() -> None:
    pooled = _cfg(["+experiment=mixed_spike_hf_cb"])
    assert kv_memory(pooled) == "the engine's KV pool of 448 x 256-token blocks"
    assert "GB VRAM" not in serving_setup(pooled)
    assert kv_memory(_cfg(["+experiment=mixed_spike"])) == "16 GB VRAM"
