"""Where requests come from: synthetic returning sessions, or a replayed trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from cachepilot_sim.config.base import Sealed, bounded, require


@dataclass
class WorkloadClass(Sealed):
    """One traffic class of returning sessions; lengths and think times are log-normal, turns
    geometric. Validated by its WorkloadConfig, which knows its key.
    """

    share: float = bounded(1.0, ge=0)
    prompt_tokens_mean: float = bounded(256.0, gt=0)
    prompt_tokens_sigma: float = bounded(0.5, ge=0)
    output_tokens_mean: float = bounded(192.0, gt=0)
    output_tokens_sigma: float = bounded(0.5, ge=0)
    turns_mean: float = bounded(4.0, ge=1)
    think_time_mean_s: float = bounded(20.0, ge=0)
    think_time_sigma: float = bounded(0.8, ge=0)
    ttft_slo_ms: float = bounded(2000.0, gt=0)
    tpot_slo_ms: float = bounded(28.0, gt=0)
    priority: int = 1
    model: str = ""  # empty: the run's primary model


def _default_classes() -> dict[str, WorkloadClass]:
    return {"chat": WorkloadClass()}


@dataclass
class WorkloadConfig(Sealed):
    """Synthetic sessions: Poisson session arrivals, a rate spike from a given request on, and
    think times scaled by `think_drift_multiplier` from `think_drift_at_request` on (reuse that
    drifts away from what a model was trained on)."""

    section: ClassVar[str | None] = "workload"
    name: str = "chat"
    classes: dict[str, WorkloadClass] = field(default_factory=_default_classes)
    num_requests: int = bounded(1000, gt=0)
    session_rate_per_s: float = bounded(0.5, gt=0)
    spike_multiplier: float = bounded(1.0, gt=0)
    spike_at_request: int = bounded(0, ge=0)
    think_drift_multiplier: float = bounded(1.0, gt=0)
    think_drift_at_request: int = bounded(0, ge=0)
    max_active_sessions: int = bounded(48, gt=0)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            len(self.classes) > 0, f"{prefix}.classes", self.classes, "needs at least one class"
        )
        for name, cls in self.classes.items():
            cls.validate(f"{prefix}.classes.{name}")
        total = sum(c.share for c in self.classes.values())
        require(
            abs(total - 1.0) <= 1e-6,
            f"{prefix}.classes.*.share",
            round(total, 9),
            "class shares must sum to 1",
        )


class TraceFormat(StrEnum):
    NONE = "none"  # synthetic sessions (the workload section)
    MOONCAKE = "mooncake"
    AZURE = "azure"
    SHAREGPT = "sharegpt"


class OnError(StrEnum):
    RAISE = "raise"  # stop at the first bad row, naming file, line and reason
    SKIP = "skip"  # skip bad rows, count them per reason and report the counts


@dataclass
class ReplayConfig(Sealed):
    """Trace replay instead of synthetic sessions: requests arrive at the trace's timestamps.

    Prefix blocks (Mooncake `hash_ids`) are shared through a reference-counted block cache; see
    docs/workloads.md. ShareGPT has lengths only: arrivals are Poisson at `arrival_rate_per_s`.
    """

    section: ClassVar[str | None] = "replay"
    format: TraceFormat = TraceFormat.NONE
    path: str = ""
    # validate replays a real engine's capture to measure a profile's error on the capture's GPU:
    # the rule that a fitted step cost runs only where its errors are committed does not apply.
    measuring: bool = False
    limit: int = bounded(0, ge=0)  # replay the first `limit` valid requests; 0: all
    on_error: OnError = OnError.RAISE
    # Multiplies every inter-arrival gap (0.5 replays twice as fast).
    time_scale: float = bounded(1.0, gt=0)
    hash_block_tokens: int = bounded(512, gt=0)  # tokens per prefix-hash block (Mooncake: 512)
    infer_sessions: bool = True  # Mooncake: a request extending an earlier one is its next turn
    arrival_rate_per_s: float = bounded(1.0, gt=0)  # ShareGPT only
    ttft_slo_ms: float = bounded(2000.0, gt=0)
    tpot_slo_ms: float = bounded(50.0, gt=0)
    priority: int = 1
    # Most prefix blocks kept (idle + in use); 0: bounded by VRAM only. A fixed cache size in
    # blocks, as a block-level LRU stack analysis assumes.
    prefix_cache_max_blocks: int = bounded(0, ge=0)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            self.format == TraceFormat.NONE or bool(self.path),
            f"{prefix}.path",
            self.path,
            f"format {str(self.format)!r} needs a trace file path",
        )
