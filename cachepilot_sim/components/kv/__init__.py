"""KV-cache managers behind one protocol: per-session KV (synthetic workloads) and prefix-shared
hash blocks (trace replay), built from shared collaborators (room rule, CPU store, transfers)."""

from __future__ import annotations

from cachepilot_sim.components.kv.prefix import PrefixKvManager
from cachepilot_sim.components.kv.protocol import (
    Admit,
    EngineQueue,
    KvDeps,
    KvManager,
    KvStats,
    Tier,
)
from cachepilot_sim.components.kv.session import SessionKvManager
from cachepilot_sim.components.kv.transfers import cpu_kv_bytes_per_token
from cachepilot_sim.config import SimConfig, TraceFormat

__all__ = [
    "Admit",
    "EngineQueue",
    "KvDeps",
    "KvManager",
    "KvStats",
    "PrefixKvManager",
    "SessionKvManager",
    "Tier",
    "cpu_kv_bytes_per_token",
    "make_kv_manager",
]


def make_kv_manager(cfg: SimConfig, deps: KvDeps) -> KvManager:
    """The manager the workload needs: prefix blocks for trace replay, sessions otherwise."""
    if cfg.replay.format == TraceFormat.NONE:
        return SessionKvManager(cfg, deps)
    return PrefixKvManager(cfg, deps)
