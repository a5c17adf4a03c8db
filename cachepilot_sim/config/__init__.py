"""Typed, validated experiment configuration, split by concern; Hydra's ConfigStore schema.

Configs are dataclasses that OmegaConf uses as schemas (so YAML and command-line overrides are type
checked), then instantiated with `OmegaConf.to_object`, which runs `validate()` and seals the
object: any later assignment raises. `frozen=True` is avoided on purpose: it makes OmegaConf mark
nodes read-only and breaks overrides and sweeps. Field bounds live in field metadata (base.py);
each eviction policy and admission controller registers its own config class (registry.py).
"""

from cachepilot_sim.config.admission import (
    ADMISSION,
    AdmissionConfig,
    admission_config,
    known_controllers,
)
from cachepilot_sim.config.base import GB, GIB, ConfigError, Sealed, bounded, require
from cachepilot_sim.config.cluster import (
    ROUTERS,
    ClusterConfig,
    LinkKind,
    RouterConfig,
    SharedTierConfig,
    TierLoad,
    TierWrite,
    known_routers,
    router_config,
)
from cachepilot_sim.config.engine import BatcherConfig, BatchMode, KVConfig, SchedulerConfig
from cachepilot_sim.config.engine_profile import EngineConfig, GraphMode, Preemption, StepCost
from cachepilot_sim.config.hardware import PCIE_GBPS_PER_LANE, GpuSpecConfig, HardwareConfig
from cachepilot_sim.config.model import ModelConfig
from cachepilot_sim.config.policy import (
    ALL_POLICIES,
    POLICIES,
    PolicyConfig,
    known_policies,
    policy_config,
)
from cachepilot_sim.config.registry import Registry
from cachepilot_sim.config.run import Objective, RunConfig, SimConfig, TelemetryConfig, TraceConfig
from cachepilot_sim.config.store import register_configs, to_config
from cachepilot_sim.config.workload import (
    OnError,
    ReplayConfig,
    TraceFormat,
    WorkloadClass,
    WorkloadConfig,
)

__all__ = [
    "ADMISSION",
    "ALL_POLICIES",
    "GB",
    "GIB",
    "PCIE_GBPS_PER_LANE",
    "POLICIES",
    "ROUTERS",
    "AdmissionConfig",
    "BatchMode",
    "BatcherConfig",
    "ClusterConfig",
    "SharedTierConfig",
    "TierLoad",
    "TierWrite",
    "ConfigError",
    "EngineConfig",
    "GpuSpecConfig",
    "LinkKind",
    "HardwareConfig",
    "KVConfig",
    "ModelConfig",
    "Objective",
    "OnError",
    "PolicyConfig",
    "GraphMode",
    "Preemption",
    "Registry",
    "ReplayConfig",
    "RouterConfig",
    "RunConfig",
    "Sealed",
    "SchedulerConfig",
    "SimConfig",
    "StepCost",
    "TelemetryConfig",
    "TraceConfig",
    "TraceFormat",
    "WorkloadClass",
    "WorkloadConfig",
    "admission_config",
    "bounded",
    "known_controllers",
    "known_policies",
    "known_routers",
    "policy_config",
    "register_configs",
    "require",
    "router_config",
    "to_config",
]
