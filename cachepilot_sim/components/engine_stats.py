"""The engine's counters over a run (iterations, busy time, tokens, KV occupancy): the batcher
fills them, the simulation reports them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Engine counters over the run: iterations, busy time, tokens, KV occupancy."""

    iterations: int = 0
    busy_us: int = 0
    tokens_prefilled: int = 0
    tokens_decoded: int = 0
    kv_byte_us: float = 0.0  # integral of (used + in flight) KV bytes over time
    kv_peak_bytes: int = 0
