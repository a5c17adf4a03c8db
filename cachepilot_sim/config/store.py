"""Hydra's view of the configs: the schema registered in the ConfigStore, and back to dataclasses.

Every registered eviction policy and admission controller stores its config class under
`policy_schema/<name>` and `admission_schema/<name>`; `conf/policy/<name>.yaml` starts from it
(`defaults: [/policy_schema/<name>@_here_, _self_]`), so the YAML a user picks decides which
fields exist and an override of another policy's field is an unknown key.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachepilot_sim.config.admission import ADMISSION
from cachepilot_sim.config.base import ConfigError
from cachepilot_sim.config.cluster import ROUTERS, ClusterConfig
from cachepilot_sim.config.engine import BatcherConfig
from cachepilot_sim.config.engine_profile import EngineConfig, required_engine_keys
from cachepilot_sim.config.hardware import GpuSpecConfig, HardwareConfig
from cachepilot_sim.config.model import ModelConfig
from cachepilot_sim.config.policy import POLICIES
from cachepilot_sim.config.registry import Registry
from cachepilot_sim.config.run import RunConfig
from cachepilot_sim.config.workload import WorkloadConfig
from cachepilot_sim.inputs import one_line, read_yaml

if TYPE_CHECKING:
    from hydra.core.config_store import ConfigStore

# Hydra and OmegaConf are imported inside the functions below: only the entry points that
# compose configs pay for them, not every import of a config class.


def _store_choices(cs: ConfigStore, registry: Registry[Any, Any]) -> None:
    from omegaconf import OmegaConf

    for name in registry.names():
        node = OmegaConf.structured(registry.entry(name).config)
        node.name = name
        cs.store(group=f"{registry.group}_schema", name=name, node=node)


REQUIRED_MODEL_KEYS = (
    "name",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "kv_dtype_bytes",
    "weight_bytes",
    "max_context_tokens",
    "num_params",
    "num_attention_heads",
)


# A GPU file must state every datasheet figure: one that omitted a key (or an empty file) ran as
# the H200, the dataclass default. Optional (empty or 0 means "none"): calibrated_hardware, the
# calibration's parameter count and the citation of the interconnect.
REQUIRED_GPU_KEYS = (
    "name",
    "display_name",
    "hbm_gb",
    "hbm_gbps",
    "bf16_dense_tflops",
    "fp8_dense_tflops",
    "pcie_gen",
    "pcie_lanes",
    "source",
    "interconnect",
    "interconnect_gbps",
    "interconnect_hop_latency_us",
)
# A hardware file is a calibration: every fitted figure, its name and its source (one that omitted
# a figure ran on the H200's calibration of 2026-11-29).
REQUIRED_HARDWARE_KEYS = tuple(f.name for f in fields(HardwareConfig))
# An engine file states every key its engine reads (engine_profile.required_engine_keys: its
# rules, and its step cost's and lazy captures' terms): one that omitted step_cost ran on the
# idealised roofline, one that omitted a rule ran by the project's own engine's, without a word.
# Every key is MISSING in the schema; `fill_unread_engine_keys` sets the ones the engine does not
# read to their (unused) defaults and refuses a missing one that it reads.
ENGINE_KEYS = tuple(f.name for f in fields(EngineConfig))
# The file each section's required keys live in (a missing one is named with it).
REQUIRED_KEYS = {
    "model": REQUIRED_MODEL_KEYS,
    "gpu": REQUIRED_GPU_KEYS,
    "hardware": REQUIRED_HARDWARE_KEYS,
    "engine": ENGINE_KEYS,
}
SCHEMAS = {
    "model": ModelConfig,
    "gpu": GpuSpecConfig,
    "hardware": HardwareConfig,
    "engine": EngineConfig,
}


def missing_key_error(section: str, key: str, where: str = "") -> ConfigError:
    """The refusal of a profile file that omits `key` (`where`: the file, if known)."""
    where = where or f"cachepilot_sim/conf/{section}/<name>.yaml"
    return ConfigError(f"required key '{section}.{key}' is not set (in {where})")


def fill_unread_engine_keys(node: Any, where: str = "") -> None:
    """Give the MISSING keys of an engine node (the `engine` section) that its step cost and
    graph mode do not read their defaults; a missing key that they read is a ConfigError
    naming it. The rules come first: step_cost and graph_mode decide what else is read."""
    from omegaconf import OmegaConf, read_write

    def missing(key: str) -> bool:
        return bool(OmegaConf.is_missing(node, key))

    for key in ("name", "step_cost", "graph_mode"):
        if missing(key):
            raise missing_key_error("engine", key, where)
    needed = required_engine_keys(str(node.step_cost), str(node.graph_mode))
    defaults = EngineConfig()
    for key in ENGINE_KEYS:
        if not missing(key):
            continue
        if key in needed:
            raise missing_key_error("engine", key, where)
        with read_write(node):
            setattr(node, key, getattr(defaults, key))


def required_schema(section: str) -> Any:
    """The structured schema of `section` (model, gpu, hardware or engine) with its REQUIRED_KEYS
    MISSING: a file read over it must state each one (tools read profiles without Hydra)."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(SCHEMAS[section])
    for key in REQUIRED_KEYS[section]:
        node[key] = "???"  # OmegaConf MISSING
    return node


def load_profile(section: str, path: Path) -> Any:
    """A profile file (model, gpu, hardware or engine section, not `# @package _global_`) read
    over its schema, validated: every required key stated, no default stands in; an error
    names the file and the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    data = read_yaml(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys, got {type(data).__name__}")
    try:
        node = OmegaConf.merge(required_schema(section), data)
        if section == "engine":
            fill_unread_engine_keys(node, str(path))
        return OmegaConf.to_object(node)
    except MissingMandatoryValue as err:
        raise missing_key_error(section, str(err.full_key), str(path)) from None
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{path}: key '{key}': {one_line(err).split('; full_key')[0]}") from None


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (the entry points call it once)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    node = OmegaConf.structured(RunConfig)
    # YAML dicts merge key by key: start the class table empty so that a workload file lists
    # exactly its own classes instead of adding to the dataclass default.
    node.workload.classes = {}
    # A model file must state its whole geometry: before, one that omitted a key silently got the
    # dataclass default (Llama-3-8B's), which tests and factories still use from Python.
    for section, keys in REQUIRED_KEYS.items():
        for key in keys:
            node[section][key] = "???"  # OmegaConf MISSING
    # `policies.<name>.<field>=v` needs no `+`: RunConfig.validate checks names and fields.
    OmegaConf.set_struct(node.policies, False)
    cs.store(name="run_schema", node=node)
    for group, schema in (
        ("hardware", HardwareConfig),
        ("gpu", GpuSpecConfig),
        ("model", ModelConfig),
        ("workload", WorkloadConfig),
        ("batcher", BatcherConfig),
        ("engine", EngineConfig),
        ("cluster", ClusterConfig),
    ):
        cs.store(group=group, name=f"{group}_schema", node=schema)
    _store_choices(cs, POLICIES)
    _store_choices(cs, ADMISSION)
    _store_choices(cs, ROUTERS)


def to_config(cfg: Any) -> RunConfig:
    """DictConfig (from Hydra) -> validated, sealed RunConfig."""
    from omegaconf import OmegaConf

    known = {f.name for f in fields(RunConfig)}
    extra = sorted(str(k) for k in cfg if k not in known)
    if extra:  # a `+key=value` override or a YAML key that no config class declares
        raise ConfigError(f"unknown config key '{extra[0]}'; top-level keys are {sorted(known)}")
    from omegaconf.errors import MissingMandatoryValue

    if "engine" in cfg:
        fill_unread_engine_keys(cfg.engine)
    try:
        obj = OmegaConf.to_object(cfg)
    except AttributeError as err:  # a sealed section refusing a key it does not declare
        raise ConfigError(f"unknown config key: {err}") from err
    except MissingMandatoryValue as err:
        section = str(err.full_key).split(".")[0]
        where = (
            f"cachepilot_sim/conf/{section}/<name>.yaml" if section in REQUIRED_KEYS else "config"
        )
        raise ConfigError(f"required key '{err.full_key}' is not set (in {where})") from err
    assert is_dataclass(obj) and isinstance(obj, RunConfig), type(obj)
    return obj
