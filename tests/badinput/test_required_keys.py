"""A model file must state its whole geometry: a missing key is an error naming the key and the
model, never Llama-3-8B's default (issue 15)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.config.store import REQUIRED_MODEL_KEYS

CONF = CONF_DIR
register_configs()


@pytest.fixture(scope="module")
def conf_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conf") / "conf"
    shutil.copytree(CONF, out)
    return out


@pytest.mark.parametrize("key", REQUIRED_MODEL_KEYS)
def test_a_model_file_without_a_required_key_is_refused(conf_copy: Path, key: str) -> None:
    model = yaml.safe_load((CONF / "model" / "qwen2_1_5b.yaml").read_text())
    del model[key]
    (conf_copy / "model" / f"no_{key}.yaml").write_text(yaml.safe_dump(model))
    with initialize_config_dir(config_dir=str(conf_copy), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model=no_{key}"])
    with pytest.raises(ConfigError, match=rf"model\.{key}") as err:
        to_config(cfg)
    assert "conf/model" in str(err.value)


def test_every_shipped_model_file_states_every_required_key() -> None:
    for path in sorted((CONF / "model").glob("*.yaml")):
        assert set(REQUIRED_MODEL_KEYS) <= set(yaml.safe_load(path.read_text())), path
