"""Parameters of the vLLM PERC policy: environment variable, extra-config mapping, hardware file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError
from cachepilot_sim.integrations.vllm.params import ENV_VAR, params_from_env, params_from_mapping


def test_unset_environment_gives_the_defaults_and_the_spec_geometry() -> None:
    params = params_from_env({}, tokens_per_chunk=256)
    assert (params.delta_s, params.ema_weight, params.tokens_per_chunk) == (30.0, 0.3, 256)


def test_environment_json_object_and_json_file_are_read(tmp_path: Path) -> None:
    assert params_from_env({ENV_VAR: '{"delta_s": 5, "ema_weight": 0.5}'}).delta_s == 5
    file = tmp_path / "perc.json"
    file.write_text(json.dumps({"prior_gap_s": 7.5, "session_field": "conversation"}))
    params = params_from_env({ENV_VAR: str(file)})
    assert (params.prior_gap_s, params.session_field) == (7.5, "conversation")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "neither a JSON object nor a readable file"),
        ('{"delta": 5}', "unknown keys ['delta']"),
        ('{"ema_weight": 1.5}', "policy.ema_weight"),
        ('{"tokens_per_chunk": 0}', "tokens_per_chunk"),
    ],
)
def test_bad_parameters_are_refused_naming_the_key(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        params_from_env({ENV_VAR: raw})


def test_hardware_file_sets_the_cost_model() -> None:
    params = params_from_mapping({"hardware_file": str(CONF_DIR / "hardware/h200_reference.yaml")})
    assert params.hardware().quantize_bytes_per_us == 4.13e6  # the file's value, not the default
    with pytest.raises(ConfigError, match="no such file"):
        params_from_mapping({"hardware_file": "/nonexistent.yaml"}).hardware()


def test_policies_built_inside_pending_params_take_them_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cachepilot_sim.integrations.vllm.params import PercParams, pending_params
    from tests.vllm_double import DoublePercCachePolicy

    monkeypatch.setenv(ENV_VAR, '{"delta_s": 7}')
    with pending_params(PercParams(delta_s=5.0, tokens_per_chunk=64)):
        inside = DoublePercCachePolicy(cache_capacity=10)  # as vLLM's manager builds it
    outside = DoublePercCachePolicy(cache_capacity=10)
    assert (inside.params.delta_s, inside.params.tokens_per_chunk) == (5.0, 64)
    assert outside.params.delta_s == 7.0
