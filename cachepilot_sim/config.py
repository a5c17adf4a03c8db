"""Typed, validated experiment configuration, registered with Hydra's ConfigStore in one place.

Configs are dataclasses that OmegaConf uses as schemas (so YAML and command-line overrides are type
checked), then instantiated with `OmegaConf.to_object`, which runs `validate()` and seals the
object: any later assignment raises. `frozen=True` is avoided on purpose: it makes OmegaConf mark
nodes read-only and breaks overrides and sweeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, ClassVar

GIB = 1024**3
GB = 10**9
ALL_POLICIES = "all"  # compare_policies: [all] runs every registered policy


class ConfigError(ValueError):
    """A config value that cannot be simulated; the message names the key and the value."""


def require(ok: bool, key: str, value: object, reason: str) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}' = {value!r}: {reason}")


class Sealed:
    """Validated on construction, read-only afterwards.

    `section` is the dotted key prefix used in error messages; an empty section means the parent
    validates this object (used for dict values, whose key is only known to the parent).
    """

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.section:
            self.validate(self.section)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"config is read-only after validation; cannot set {name!r}")
        object.__setattr__(self, name, value)

    def validate(self, prefix: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _nonneg(obj: object, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        require(
            isinstance(value, int | float) and math.isfinite(value) and value >= 0,
            f"{prefix}.{name}",
            value,
            "must be a finite number >= 0",
        )


def _positive(obj: object, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        require(
            isinstance(value, int | float) and math.isfinite(value) and value > 0,
            f"{prefix}.{name}",
            value,
            "must be a finite number > 0",
        )


@dataclass
class HardwareConfig(Sealed):
    """Accelerator and link parameters of the cost model (see cost/model.py for the formulas)."""

    section: ClassVar[str] = "hardware"
    name: str = "h200"
    # Defaults: the H200 calibration of 2026-11-29 (conf/hardware/h200.yaml; a test checks it).
    hbm_bytes_per_us: float = 2644125.349444123
    prefill_token_us: float = 18.774784899961098
    attention_token2_us: float = 0.0014449815343814405
    step_overhead_us: float = 778.5392007599909
    pcie_h2d_latency_us: float = 5.087833751592979
    pcie_h2d_bytes_per_us: float = 51279.48774063125
    pcie_d2h_latency_us: float = 3.713765748178057
    pcie_d2h_bytes_per_us: float = 52702.402988170135
    quantize_bytes_per_us: float = 3857292.166640563
    source: str = "experiments/calibration/2026-11-29_h200.json, NVIDIA H200, 2026-11-29"

    def validate(self, prefix: str) -> None:
        _positive(
            self,
            prefix,
            "hbm_bytes_per_us",
            "prefill_token_us",
            "pcie_h2d_bytes_per_us",
            "pcie_d2h_bytes_per_us",
            "quantize_bytes_per_us",
        )
        _nonneg(
            self,
            prefix,
            "attention_token2_us",
            "step_overhead_us",
            "pcie_h2d_latency_us",
            "pcie_d2h_latency_us",
        )


@dataclass
class GpuSpecConfig(Sealed):
    """One accelerator's datasheet figures (conf/gpu/*.yaml; each figure's source is cited there).

    Dense tensor-core rates, i.e. the datasheets' "with sparsity" figures halved. Capacities and
    bandwidths in decimal units, as the datasheets print them. `calibrated_hardware` names a
    conf/hardware file measured on this part, shown beside the datasheet by the scorecard.
    """

    section: ClassVar[str] = "gpu"
    name: str = "h200"
    display_name: str = "NVIDIA H200 SXM"
    hbm_gb: float = 141.0
    hbm_gbps: float = 4800.0
    bf16_dense_tflops: float = 989.5
    fp8_dense_tflops: float = 1979.0  # 0: no FP8 tensor cores (the BF16 rate is used)
    pcie_gen: int = 5
    pcie_lanes: int = 16
    calibrated_hardware: str = ""
    # Parameters of the model the calibration replayed: turns its per-token time into TFLOP/s.
    calibration_num_params: int = 0

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gb * GB)

    def validate(self, prefix: str) -> None:
        require(bool(self.name), f"{prefix}.name", self.name, "must not be empty")
        _positive(self, prefix, "hbm_gb", "hbm_gbps", "bf16_dense_tflops", "pcie_lanes")
        _nonneg(self, prefix, "fp8_dense_tflops", "calibration_num_params")
        require(
            self.pcie_gen in PCIE_GBPS_PER_LANE,
            f"{prefix}.pcie_gen",
            self.pcie_gen,
            f"known generations: {sorted(PCIE_GBPS_PER_LANE)}",
        )


# Usable GB/s per lane and direction after line coding (PCI-SIG: 8b/10b for Gen1-2, 128b/130b for
# Gen3-5; Gen6 uses FLIT mode, 242/256 efficiency).
PCIE_GBPS_PER_LANE = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8,
                      6: 64 * 242 / 256 / 8}


@dataclass
class ModelConfig(Sealed):
    """A served model: its pinned weights and the KV geometry that sets bytes per token."""

    section: ClassVar[str] = "model"
    name: str = "llama3_8b_fp8w"
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    kv_dtype_bytes: int = 2
    weight_bytes: int = 8_030_000_000
    max_context_tokens: int = 131_072
    # Roofline figures (the scorecard's compute bound; the simulator does not read them).
    num_params: int = 8_030_000_000
    num_attention_heads: int = 32  # query heads; attention FLOPs scale with these, KV with kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def validate(self, prefix: str) -> None:
        _positive(
            self,
            prefix,
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "kv_dtype_bytes",
            "max_context_tokens",
        )
        _nonneg(self, prefix, "weight_bytes", "num_params", "num_attention_heads")
        require(bool(self.name), f"{prefix}.name", self.name, "must not be empty")


@dataclass
class WorkloadClass(Sealed):
    """One traffic class of returning sessions; lengths and think times are log-normal, turns
    geometric.
    """

    share: float = 1.0
    prompt_tokens_mean: float = 256.0
    prompt_tokens_sigma: float = 0.5
    output_tokens_mean: float = 192.0
    output_tokens_sigma: float = 0.5
    turns_mean: float = 4.0
    think_time_mean_s: float = 20.0
    think_time_sigma: float = 0.8
    ttft_slo_ms: float = 2000.0
    tpot_slo_ms: float = 28.0
    priority: int = 1
    model: str = ""  # empty: the run's primary model

    def validate(self, prefix: str) -> None:
        _nonneg(
            self,
            prefix,
            "share",
            "prompt_tokens_sigma",
            "output_tokens_sigma",
            "think_time_mean_s",
            "think_time_sigma",
        )
        _positive(
            self, prefix, "prompt_tokens_mean", "output_tokens_mean", "ttft_slo_ms", "tpot_slo_ms"
        )
        require(self.turns_mean >= 1.0, f"{prefix}.turns_mean", self.turns_mean, "must be >= 1")


def _default_classes() -> dict[str, WorkloadClass]:
    return {"chat": WorkloadClass()}


@dataclass
class WorkloadConfig(Sealed):
    """Synthetic sessions: Poisson session arrivals, a rate spike from a given request on."""

    section: ClassVar[str] = "workload"
    name: str = "chat"
    classes: dict[str, WorkloadClass] = field(default_factory=_default_classes)
    num_requests: int = 1000
    session_rate_per_s: float = 0.5
    spike_multiplier: float = 1.0
    spike_at_request: int = 0
    max_active_sessions: int = 48

    def validate(self, prefix: str) -> None:
        _positive(
            self,
            prefix,
            "num_requests",
            "session_rate_per_s",
            "spike_multiplier",
            "max_active_sessions",
        )
        _nonneg(self, prefix, "spike_at_request")
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


class BatchMode(StrEnum):
    MAX_THROUGHPUT = "max_throughput"
    LOW_LATENCY = "low_latency"
    ADAPTIVE = "adaptive"


@dataclass
class BatcherConfig(Sealed):
    """Iteration-level continuous batching limits per mode, and the ADAPTIVE switch thresholds."""

    section: ClassVar[str] = "batcher"
    mode: BatchMode = BatchMode.ADAPTIVE
    throughput_token_budget: int = 8192
    throughput_max_seqs: int = 256
    latency_token_budget: int = 1024
    latency_max_seqs: int = 64
    adaptive_queue_depth: int = 16
    adaptive_slack_ms: float = 500.0
    # Pure-decode iterations simulated per SimPy event at most (a simulation-speed knob: the result
    # equals step-by-step simulation except that blocks for the run are reserved at its start).
    max_decode_run: int = 256

    def validate(self, prefix: str) -> None:
        _positive(
            self,
            prefix,
            "max_decode_run",
            "throughput_token_budget",
            "throughput_max_seqs",
            "latency_token_budget",
            "latency_max_seqs",
            "adaptive_queue_depth",
        )
        _nonneg(self, prefix, "adaptive_slack_ms")


@dataclass
class SchedulerConfig(Sealed):
    """Priority queue with SLA-deadline promotion and an optional client give-up time."""

    section: ClassVar[str] = "scheduler"
    promote_slack_ms: float = 250.0
    queue_timeout_s: float = 0.0  # 0: requests never give up while queued

    def validate(self, prefix: str) -> None:
        _nonneg(self, prefix, "promote_slack_ms", "queue_timeout_s")


ADMISSION_CONTROLLERS = ("all", "threshold", "learned")  # admission/registry.py registers these


@dataclass
class AdmissionConfig(Sealed):
    """Admission control of new sessions under KV pressure (docs/admission.md).

    `all` admits everything (the behaviour without admission control). The others are consulted
    only for a session's first turn, and only while the pool is under pressure: the request's KV
    need exceeds free + evictable bytes, or `pressure_queue_depth` requests are queued.
    """

    section: ClassVar[str] = "admission"
    name: str = "all"
    defer_ms: float = 200.0  # a deferred request re-enters the queue after this long
    max_defers: int = 3  # after this many defers a defer counts as admit
    pressure_queue_depth: int = 8
    # threshold: defer (then reject) when (used + in flight) / pool > load_fraction and
    # queue depth > queue_depth.
    threshold_load_fraction: float = 0.9
    threshold_queue_depth: int = 16
    weights: str = ""  # learned: path of the .npz written by train_admission

    def validate(self, prefix: str) -> None:
        require(self.name in ADMISSION_CONTROLLERS, f"{prefix}.name", self.name,
                f"unknown admission controller; known: {list(ADMISSION_CONTROLLERS)}")
        _nonneg(self, prefix, "defer_ms", "max_defers", "pressure_queue_depth",
                "threshold_queue_depth")
        require(0.0 <= self.threshold_load_fraction <= 1.0, f"{prefix}.threshold_load_fraction",
                self.threshold_load_fraction, "must be in [0, 1]")
        require(self.name != "learned" or bool(self.weights), f"{prefix}.weights", self.weights,
                "admission=learned needs admission.weights=PATH (an .npz from train_admission)")


@dataclass
class KVConfig(Sealed):
    """Paged KV pool and CPU offload store."""

    section: ClassVar[str] = "kv"
    block_tokens: int = 16
    activation_reserve_bytes: int = 1 * GIB
    watermark_fraction: float = 0.01
    offload_enabled: bool = True
    cpu_store_bytes: int = 64 * GIB
    # When the CPU store is full, drop its least recently offloaded KV to take a new victim (as an
    # LRU CPU tier does); false: a victim that does not fit is dropped instead.
    cpu_store_evicts_lru: bool = True
    # Bytes a KV value takes in the CPU store. 0: as on the GPU (a plain copy). Fewer (1: INT8 with
    # a float32 scale per token and (layer, K|V) row, as the project's kernels): quantized on the
    # GPU before the device-to-host copy and dequantized after the host-to-device copy, each at
    # hardware.quantize_bytes_per_us; the copies and the store hold the smaller form.
    offload_dtype_bytes: int = 0

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "block_tokens")
        _nonneg(self, prefix, "activation_reserve_bytes", "cpu_store_bytes", "watermark_fraction",
                "offload_dtype_bytes")
        require(
            self.watermark_fraction < 0.5,
            f"{prefix}.watermark_fraction",
            self.watermark_fraction,
            "must be < 0.5",
        )


@dataclass
class PolicyConfig(Sealed):
    """Which eviction policy runs, and PERC's parameters (ignored by policies that do not use
    them).
    """

    section: ClassVar[str] = "policy"
    name: str = "perc"
    delta_s: float = 30.0
    ema_weight: float = 0.3
    prior_gap_s: float = 20.0
    # Policy lab (issue 5). Exact oracle: HiGHS time limit per decision (the proven gap is reported
    # when it is hit); shadow: score every decision of the running policy against the oracle.
    oracle_time_limit_s: float = 1.0
    shadow_oracle: bool = False
    # SLRU: share of the idle KV bytes the protected (reused) segment may hold.
    slru_protected_fraction: float = 0.8
    # Marconi-style utility = recency + flop_weight x FLOP efficiency (both min-max normalised).
    flop_weight: float = 1.0
    # PERC-hazard: idle gaps kept per workload class for the survival estimate (oldest dropped).
    hazard_max_gaps: int = 512
    # T-LRU: restore time (ms) under which losing a session's KV cannot breach the TTFT tail target.
    tlru_threshold_ms: float = 200.0

    def validate(self, prefix: str) -> None:
        from cachepilot_sim.policies import known_policies

        known = known_policies()
        require(self.name in known, f"{prefix}.name", self.name, f"unknown policy; known: {known}")
        _positive(self, prefix, "delta_s", "prior_gap_s", "oracle_time_limit_s", "hazard_max_gaps")
        _nonneg(self, prefix, "flop_weight", "tlru_threshold_ms")
        require(
            0.0 < self.ema_weight <= 1.0,
            f"{prefix}.ema_weight",
            self.ema_weight,
            "must be in (0, 1]",
        )
        require(
            0.0 <= self.slru_protected_fraction <= 1.0,
            f"{prefix}.slru_protected_fraction",
            self.slru_protected_fraction,
            "must be in [0, 1]",
        )


@dataclass
class TraceConfig(Sealed):
    """Event trace to Parquet: on/off, iteration sampling, session sampling, rows per chunk."""

    section: ClassVar[str] = "trace"
    enabled: bool = True
    iteration_every: int = 10
    chunk_rows: int = 200_000
    # Keep every row of one session in k (session id % k == 0); 1 traces every session.
    session_every: int = 1

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "iteration_every", "chunk_rows", "session_every")
        for name in ("iteration_every", "chunk_rows", "session_every"):
            value = getattr(self, name)
            require(isinstance(value, int), f"{prefix}.{name}", value, "must be an integer")


@dataclass
class TelemetryConfig(Sealed):
    """What a run reports while and after it runs (never changes results): a rich progress bar
    when stdout is a terminal, the Prometheus exposition file, a 127.0.0.1 metrics server."""

    section: ClassVar[str] = "telemetry"
    progress: bool = True
    progress_every_events: int = 50_000
    prometheus_file: bool = True
    prometheus_port: int = 0  # 0: no server; else serve /metrics on 127.0.0.1:<port> during the run

    def validate(self, prefix: str) -> None:
        _positive(self, prefix, "progress_every_events")
        require(
            isinstance(self.prometheus_port, int) and 0 <= self.prometheus_port <= 65535,
            f"{prefix}.prometheus_port",
            self.prometheus_port,
            "must be a port in 0..65535",
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

    section: ClassVar[str] = "replay"
    format: TraceFormat = TraceFormat.NONE
    path: str = ""
    limit: int = 0  # replay the first `limit` valid requests; 0: all
    on_error: OnError = OnError.RAISE
    time_scale: float = 1.0  # multiplies every inter-arrival gap (0.5 replays twice as fast)
    hash_block_tokens: int = 512  # tokens per prefix-hash block (Mooncake: 512)
    infer_sessions: bool = True  # Mooncake: a request extending an earlier one is its next turn
    arrival_rate_per_s: float = 1.0  # ShareGPT only
    ttft_slo_ms: float = 2000.0
    tpot_slo_ms: float = 50.0
    priority: int = 1
    # Most prefix blocks kept (idle + in use); 0: bounded by VRAM only. A fixed cache size in
    # blocks, as a block-level LRU stack analysis assumes.
    prefix_cache_max_blocks: int = 0

    def validate(self, prefix: str) -> None:
        _nonneg(self, prefix, "limit", "prefix_cache_max_blocks")
        _positive(self, prefix, "time_scale", "hash_block_tokens", "arrival_rate_per_s",
                  "ttft_slo_ms", "tpot_slo_ms")
        require(self.format == TraceFormat.NONE or bool(self.path), f"{prefix}.path", self.path,
                f"format {str(self.format)!r} needs a trace file path")


class StepCost(StrEnum):
    ROOFLINE = "roofline"  # cost/model.py over hardware.*: an idealised kernel-bound engine
    FITTED = "fitted"  # cost/engine_step.py: a real engine's step time, fitted from its micro-runs


@dataclass
class EngineConfig(Sealed):
    """Which serving engine the batcher imitates (conf/engine/*.yaml; docs/validation.md).

    `default` is the project's own engine model. A profile of a real engine sets the batcher, KV
    and scheduler sections to that engine's rules and, here, what those sections do not hold: its
    step cost, its KV pool size in blocks and its asynchronous scheduling.
    """

    section: ClassVar[str] = "engine"
    name: str = "default"
    step_cost: StepCost = StepCost.ROOFLINE
    # FITTED: step time = sum of coefficient x feature (cost.engine_step.EngineStepFit).
    const_us: float = 0.0
    q_padded_token_us: float = 0.0
    kv_read_token_us: float = 0.0
    kv_read_token2_us: float = 0.0  # per (10^3 KV tokens read)^2
    seqlen_per_sqrt_request_us: float = 0.0  # longest sequence / sqrt(requests in the step)
    prefill_seqlen_us: float = 0.0  # per 10^3 (prefill token x longest sequence token) pairs
    request_us: float = 0.0
    q_pad_tokens: int = 256  # queries are padded to a multiple of this (CUDA graph shapes)
    # KV pool in blocks of kv.block_tokens, as the engine allocated it; 0: from vram_gb.
    kv_pool_blocks: int = 0
    # Async batching: step n+1 is scheduled while step n runs, so a request admitted at a step
    # boundary computes from the step after, and a finished request still takes a decode slot
    # (and its KV read) in the step after its last token.
    async_scheduling: bool = False
    # While free KV (idle cached blocks included) is under this fraction of the pool, no new
    # request is admitted next to running ones (transformers' safety_margin; the engine also holds
    # back split prefills then, which with whole-prompt allocation here starved admission); 0: off.
    prefill_margin_fraction: float = 0.0

    def validate(self, prefix: str) -> None:
        _nonneg(self, prefix, "const_us", "q_padded_token_us", "kv_read_token_us",
                "kv_read_token2_us", "seqlen_per_sqrt_request_us", "prefill_seqlen_us",
                "request_us", "kv_pool_blocks", "prefill_margin_fraction")
        _positive(self, prefix, "q_pad_tokens")
        require(self.prefill_margin_fraction < 1.0, f"{prefix}.prefill_margin_fraction",
                self.prefill_margin_fraction, "must be < 1")


@dataclass
class SimConfig(Sealed):
    """Everything one simulation needs: one policy, one seed."""

    section: ClassVar[str] = "sim"
    seed: int = 0
    vram_gb: float = 16.0
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    extra_models: list[ModelConfig] = field(default_factory=list)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def vram_bytes(self) -> int:
        return int(self.vram_gb * GB)

    @property
    def models(self) -> list[ModelConfig]:
        return [self.model, *self.extra_models]

    @property
    def kv_pool_bytes(self) -> int:
        """VRAM left for KV after every model's pinned weights and the activation reserve, or the
        engine profile's pool of `engine.kv_pool_blocks` blocks."""
        if self.engine.kv_pool_blocks:
            return self.engine.kv_pool_blocks * self.kv.block_tokens * self.model.kv_bytes_per_token
        weights = sum(m.weight_bytes for m in self.models)
        return self.vram_bytes - weights - self.kv.activation_reserve_bytes

    def validate(self, prefix: str) -> None:
        _positive(self, "", "vram_gb")
        names = [m.name for m in self.models]
        require(len(set(names)) == len(names), "extra_models", names, "model names must be unique")
        if self.replay.format != TraceFormat.NONE:
            require(self.replay.hash_block_tokens % self.kv.block_tokens == 0,
                    "replay.hash_block_tokens", self.replay.hash_block_tokens,
                    f"must be a multiple of kv.block_tokens = {self.kv.block_tokens}")
        for cls_name, cls in self.workload.classes.items():
            require(
                cls.model in ("", *names),
                f"workload.classes.{cls_name}.model",
                cls.model,
                f"no such model; configured: {names}",
            )
        if self.kv.offload_dtype_bytes:
            require(self.replay.format == TraceFormat.NONE, "kv.offload_dtype_bytes",
                    self.kv.offload_dtype_bytes, "a quantized CPU tier is modelled for session KV "
                    "only, not for trace replay's prefix blocks")
            require(all(self.kv.offload_dtype_bytes <= m.kv_dtype_bytes for m in self.models),
                    "kv.offload_dtype_bytes", self.kv.offload_dtype_bytes,
                    "must not exceed any model's kv_dtype_bytes (0: as on the GPU)")
        if self.engine.kv_pool_blocks:
            return  # the engine's own pool size; it fits by construction
        weights = sum(m.weight_bytes for m in self.models)
        largest_block = max(m.kv_bytes_per_token for m in self.models) * self.kv.block_tokens
        require(
            self.kv_pool_bytes >= 64 * largest_block,
            "vram_gb",
            self.vram_gb,
            f"cannot hold the model: {weights / GB:.2f} GB of pinned weights plus "
            f"{self.kv.activation_reserve_bytes / GB:.2f} GB activation reserve leave "
            f"{self.kv_pool_bytes / GB:.3f} GB, under 64 KV blocks",
        )


@dataclass
class RunConfig(SimConfig):
    """Top-level Hydra config: a SimConfig plus what to compare (policies x seeds)."""

    section: ClassVar[str] = "run"
    seeds: int = 5  # single-seed comparisons of eviction policies mislead
    compare_policies: list[str] = field(default_factory=list)
    write_requests: bool = True
    jobs: int = 0  # worker processes for the (policy, seed) cells; 0: one per CPU core
    # Policy lab: after each cell, the offline LP lower bound on restore cost over its recorded
    # access sequence (cachepilot_sim/experiment/offline.py).
    offline_bound: bool = False
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(self.seeds >= 1, "seeds", self.seeds, "must be >= 1")
        require(self.jobs >= 0, "jobs", self.jobs, "must be >= 0 (0: one per CPU core)")
        from cachepilot_sim.policies import known_policies

        for name in self.compare_policies:
            if name == ALL_POLICIES and len(self.compare_policies) == 1:
                continue
            require(name in known_policies(), "compare_policies", name,
                    f"unknown policy; known: {known_policies()} (or [{ALL_POLICIES}] alone)")

    def policy_names(self) -> list[str]:
        """The policies this run compares: `[all]` means every registered policy."""
        from cachepilot_sim.policies import known_policies

        if list(self.compare_policies) == [ALL_POLICIES]:
            return known_policies()
        return list(self.compare_policies) or [self.policy.name]

    def sim_for(self, policy_name: str, seed: int) -> SimConfig:
        """The SimConfig of one (policy, seed) cell of this run."""
        values = {f.name: getattr(self, f.name) for f in fields(SimConfig)}
        policy = {f.name: getattr(self.policy, f.name) for f in fields(PolicyConfig)}
        policy["name"] = policy_name
        values.update(seed=seed, policy=PolicyConfig(**policy))
        return SimConfig(**values)


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called once by the entry point)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    node = OmegaConf.structured(RunConfig)
    # YAML dicts merge key by key: start the class table empty so that a workload file lists
    # exactly its own classes instead of adding to the dataclass default.
    node.workload.classes = {}
    cs.store(name="run_schema", node=node)
    for group, node in (
        ("hardware", HardwareConfig),
        ("model", ModelConfig),
        ("workload", WorkloadConfig),
        ("batcher", BatcherConfig),
        ("policy", PolicyConfig),
        ("admission", AdmissionConfig),
        ("engine", EngineConfig),
    ):
        cs.store(group=group, name=f"{group}_schema", node=node)


def to_config(cfg: Any) -> RunConfig:
    """DictConfig (from Hydra) -> validated, sealed RunConfig."""
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(cfg)
    assert is_dataclass(obj) and isinstance(obj, RunConfig), type(obj)
    return obj
