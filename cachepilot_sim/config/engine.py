"""The serving engine's knobs: continuous batching, the request queue, the paged KV pool."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from cachepilot_sim.clock import s_to_us
from cachepilot_sim.config.base import GIB, Sealed, bounded, join_key, require


class BatchMode(StrEnum):
    MAX_THROUGHPUT = "max_throughput"
    LOW_LATENCY = "low_latency"
    ADAPTIVE = "adaptive"


@dataclass
class BatcherConfig(Sealed):
    """Iteration-level continuous batching limits per mode, and the ADAPTIVE switch thresholds."""

    section: ClassVar[str | None] = "batcher"
    mode: BatchMode = BatchMode.ADAPTIVE
    throughput_token_budget: int = bounded(8192, gt=0)
    throughput_max_seqs: int = bounded(256, gt=0)
    latency_token_budget: int = bounded(1024, gt=0)
    latency_max_seqs: int = bounded(64, gt=0)
    adaptive_queue_depth: int = bounded(16, gt=0)
    adaptive_slack_ms: float = bounded(500.0, ge=0)
    # Pure-decode iterations simulated per SimPy event at most (a simulation-speed knob: the result
    # equals step-by-step simulation except that blocks for the run are reserved at its start).
    max_decode_run: int = bounded(256, gt=0)
    # True: a decode run reserves the blocks all its steps will need at its start, so those blocks
    # are taken before the steps that fill them (fewer events); False: a block is taken at the step
    # that crosses into it, as a paged engine does, and runs stop at the next block boundary.
    reserve_run_blocks: bool = True


@dataclass
class SchedulerConfig(Sealed):
    """Priority queue with SLA-deadline promotion and an optional client give-up time."""

    section: ClassVar[str | None] = "scheduler"
    promote_slack_ms: float = bounded(250.0, ge=0)
    # False: no deadline promotion at all (an engine without SLA scheduling: FIFO by arrival, as
    # vLLM's FCFS and transformers' FIFO schedulers); a request past its deadline would otherwise
    # jump ahead of every newer one, a preempted request included.
    deadline_promotion: bool = True
    queue_timeout_s: float = bounded(0.0, ge=0)  # 0: requests never give up while queued

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        # Time is integer us: a timeout that rounds to 0 us would silently mean "never give up".
        require(
            self.queue_timeout_s == 0 or s_to_us(self.queue_timeout_s) >= 1,
            join_key(prefix, "queue_timeout_s"),
            self.queue_timeout_s,
            "must be 0 (never give up) or at least 1e-6 (1 us, the clock's resolution)",
        )


@dataclass
class KVConfig(Sealed):
    """Paged KV pool and CPU offload store."""

    section: ClassVar[str | None] = "kv"
    block_tokens: int = bounded(16, gt=0)
    activation_reserve_bytes: int = bounded(1 * GIB, ge=0)
    watermark_fraction: float = bounded(0.01, ge=0, lt=0.5)
    offload_enabled: bool = True
    cpu_store_bytes: int = bounded(64 * GIB, ge=0)
    # When the CPU store is full, drop its least recently offloaded KV to take a new victim (as an
    # LRU CPU tier does); false: a victim that does not fit is dropped instead.
    cpu_store_evicts_lru: bool = True
    # Bytes a KV value takes in the CPU store. 0: as on the GPU (a plain copy). Fewer (1: INT8 with
    # a float32 scale per token and (layer, K|V) row, as the project's kernels): quantized on the
    # GPU before the device-to-host copy and dequantized after the host-to-device copy, each at
    # hardware.quantize_bytes_per_us; the copies and the store hold the smaller form.
    offload_dtype_bytes: int = bounded(0, ge=0)
