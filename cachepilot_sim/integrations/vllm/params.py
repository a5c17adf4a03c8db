"""Parameters of the vLLM PERC policy: delta, EMA weight, gap prior, hardware file, chunk geometry.

vLLM builds a cache policy with `cache_capacity` only, so parameters reach it one of two ways: the
`cachepilot_perc` mapping of `kv_connector_extra_config`, read by `spec.PercCPUOffloadingSpec`
(which also knows the chunk geometry) and handed over through `pending_params`; or, with vLLM's
plain CPUOffloadingSpec, the environment variable `CACHEPILOT_PERC` (a JSON object, or a path to a
JSON file). Keys either source lacks take the defaults below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cachepilot_sim.config import ConfigError, HardwareConfig, PolicyConfig, require

ENV_VAR = "CACHEPILOT_PERC"
EXTRA_CONFIG_KEY = "cachepilot_perc"
# kv_connector_extra_config's eviction_policy and cache_policy_module_path for our policy.
POLICY_NAME = "PercCachePolicy"
FORECAST_POLICY_NAME = "ReuseForecastCachePolicy"
POLICY_MODULE = "cachepilot_sim.integrations.vllm.policy"


@dataclass(frozen=True, slots=True)
class PercParams:
    """What the vLLM adapter needs beyond the chunks it is given.

    delta_s, ema_weight, prior_gap_s: PERC's horizon and gap estimator (as `PolicyConfig`).
    hardware_file: YAML of `HardwareConfig` fields (e.g. conf/hardware/h200.yaml); empty: H200.
    tokens_per_chunk: tokens in one offloaded chunk (block size x blocks per chunk); used for a
        chunk's token span when vLLM gives no key position, and as its size for the per-byte score.
    session_field: key of the session id in kv_transfer_params or in a kv hint's payload.
    class_field: key of the session's workload class index in kv_transfer_params (read by
        reuse_forecast's features; absent: unknown class, the forecast backs off to the
        population curve).
    forecast_model: reuse_forecast's survival table (a shipped table's name or a .json path).
    """

    delta_s: float = 30.0
    ema_weight: float = 0.3
    prior_gap_s: float = 20.0
    hardware_file: str = ""
    tokens_per_chunk: int = 16
    session_field: str = "session_id"
    class_field: str = "session_class"
    forecast_model: str = "mixed_spike"

    def __post_init__(self) -> None:
        self.policy_config()  # validates delta_s, ema_weight, prior_gap_s
        require(
            isinstance(self.tokens_per_chunk, int) and self.tokens_per_chunk > 0,
            f"{EXTRA_CONFIG_KEY}.tokens_per_chunk",
            self.tokens_per_chunk,
            "must be an integer > 0",
        )
        require(
            bool(self.session_field),
            f"{EXTRA_CONFIG_KEY}.session_field",
            self.session_field,
            "must not be empty",
        )
        require(
            bool(self.class_field),
            f"{EXTRA_CONFIG_KEY}.class_field",
            self.class_field,
            "must not be empty",
        )

    def policy_config(self) -> PolicyConfig:
        """The simulator's PERC config with these parameters (validated there)."""
        return PolicyConfig(
            name="perc",
            delta_s=float(self.delta_s),
            ema_weight=float(self.ema_weight),
            prior_gap_s=float(self.prior_gap_s),
        )

    def hardware(self) -> HardwareConfig:
        """The cost-model parameters: the hardware file when given, else the H200 defaults."""
        if not self.hardware_file:
            return HardwareConfig()
        return load_hardware(Path(self.hardware_file))


def load_hardware(path: Path) -> HardwareConfig:
    """A hardware YAML (conf/hardware/*.yaml) as a validated HardwareConfig."""
    from omegaconf import OmegaConf

    if not path.is_file():
        raise ConfigError(f"config key '{EXTRA_CONFIG_KEY}.hardware_file' = '{path}': no such file")
    node = OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(path))
    hw = OmegaConf.to_object(node)
    assert isinstance(hw, HardwareConfig)
    return hw


def params_from_mapping(values: Mapping[str, Any], **defaults: Any) -> PercParams:
    """PercParams from a mapping; unknown keys are an error naming the known ones.

    `defaults` are used for keys the mapping lacks (the spec passes the chunk geometry it knows).
    """
    known = {f.name for f in fields(PercParams)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"config key '{EXTRA_CONFIG_KEY}' has unknown keys {unknown}; known: {sorted(known)}"
        )
    return PercParams(**{**defaults, **dict(values)})


def params_from_env(environ: Mapping[str, str] | None = None, **defaults: Any) -> PercParams:
    """PercParams from $CACHEPILOT_PERC (JSON object or path to a JSON file); defaults if unset."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "").strip()
    if not raw:
        return params_from_mapping({}, **defaults)
    text = raw if raw.startswith("{") else _read_json_file(raw)
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"${ENV_VAR} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"${ENV_VAR} must hold a JSON object, got {type(values).__name__}")
    return params_from_mapping(values, **defaults)


def _read_json_file(path: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"${ENV_VAR} = {path!r}: neither a JSON object nor a readable file")
    return file.read_text()


_pending: list[PercParams] = []


@contextmanager
def pending_params(params: PercParams) -> Iterator[None]:
    """Policies built in this block (by vLLM's manager, from cache_capacity alone) use `params`."""
    _pending.append(params)
    try:
        yield
    finally:
        _pending.pop()


def resolve_params() -> PercParams:
    """What a policy built without explicit params uses: pending_params, else the environment."""
    return _pending[-1] if _pending else params_from_env()
