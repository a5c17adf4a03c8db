"""Which serving engine the batcher imitates (conf/engine/*.yaml in the package).

`default` is the project's own engine model. A profile of a real engine sets the batcher, KV and
scheduler sections to that engine's rules and, here, what those sections do not hold: its step
cost, its KV pool size in blocks, its asynchronous scheduling and its prefill safety margin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from cachepilot_sim.config.base import Sealed, bounded, join_key, require


class StepCost(StrEnum):
    ROOFLINE = "roofline"  # cost/model.py over hardware.*: an idealised kernel-bound engine
    FITTED = "fitted"  # cost/engine_step.py: a real engine's step time, fitted from its micro-runs
    # cost/step_physical.py: the engine's kernels on a measured GPU profile (engine.gpu_profile)
    # at its padded launch shape, with a few constants fitted from its micro-runs
    PHYSICAL = "physical"


# The coefficients of a fitted step cost (cost/engine_step.py): at least one must be positive.
# Each is bounded by MAX_COST_US: beyond 10^9 us (a quarter hour per token) a figure is a typo.
FITTED_COST_KEYS = (
    "const_us",
    "q_padded_token_us",
    "kv_read_token_us",
    "kv_read_token2_us",
    "seqlen_us",
    "seqlen_per_sqrt_request_us",
    "prefill_seqlen_us",
    "request_us",
)


MAX_COST_US = 1e9
MAX_INT = 2**31 - 1  # token and block counts: beyond it, a typo (and int32 engine indices overflow)

# What an engine file must state (config/store.py refuses a file that omits one, naming it): the
# rules the batcher, the KV pool and the scheduler read for every engine, then the terms of its
# step cost and of its graph captures. A key an engine does not read (a fitted coefficient of a
# roofline engine) may be omitted; a key it reads never takes the project's own engine's value.
ENGINE_RULE_KEYS = (
    "name",
    "step_cost",
    "graph_mode",
    "kv_pool_blocks",
    "cpu_swap_blocks",
    "async_scheduling",
    "async_finish_slot",
    "admit_after_preemption",
    "prefill_margin_fraction",
    "preemption",
    "admit_past_blocked",
    "grow_before_admit",
    "prompt_room_tokens",
    "atomic_admission",
    "kv_read_cap",
)
PHYSICAL_COST_KEYS = (
    "gpu_profile",
    "physical_overhead_us",
    "physical_request_us",
    "physical_gemm_scale",
    "physical_kv_copy_scale",
    "physical_attention_scale",
    "physical_elementwise_scale",
    "physical_grid_block_ns",
)
# A measured step cost says where and at which padding it was measured.
MEASURED_COST_KEYS = ("q_pad_tokens", "kv_pad_tokens", "fitted_on", "fitted_settings")
LAZY_GRAPH_KEYS = ("q_pad_tokens", "kv_pad_tokens", "graph_capture_us", "graph_captures_per_shape")


def required_engine_keys(step_cost: str, graph_mode: str) -> tuple[str, ...]:
    """The EngineConfig keys an engine file with this step cost and graph mode must state
    (`step_cost`, `graph_mode`: the enum names or values as a YAML file spells them)."""
    cost, graphs = step_cost.lower(), graph_mode.lower()
    keys = list(ENGINE_RULE_KEYS)
    if cost == StepCost.FITTED:
        keys += [*FITTED_COST_KEYS, "q_shape_us", *MEASURED_COST_KEYS]
    if cost == StepCost.PHYSICAL:
        keys += [*PHYSICAL_COST_KEYS, *MEASURED_COST_KEYS]
    if graphs == GraphMode.LAZY:
        keys += list(LAZY_GRAPH_KEYS)
    return tuple(dict.fromkeys(keys))


class PhysicalKernels(StrEnum):
    """Whose kernels and padding the physical step cost prices (cost/step_physical.py)."""

    HF_CB = "hf_cb"  # transformers CB: padded graphs, index_select KV gather, padded slots
    VLLM = "vllm"  # vLLM 0.26 FULL_DECODE_ONLY: decode graphs at capture sizes, eager otherwise


class GraphMode(StrEnum):
    """How the engine replays its forward passes (transformers CB: `use_cuda_graph`)."""

    NONE = "none"  # eager: no graphs, no capture stalls (the step cost is host-bound)
    PRECAPTURED = "precaptured"  # every padded shape captured before serving: no stalls
    # A graph is captured the first time a padded step shape is launched on an IO buffer set,
    # during serving: that step stalls `graph_capture_us`. Steps take the
    # `graph_captures_per_shape` buffer sets in turn (async batching: two), so a shape is
    # captured once per set, for the engine's lifetime (components/graph_capture.py).
    LAZY = "lazy"


class Preemption(StrEnum):
    """What the engine does when a decoding sequence needs a KV block and none is free."""

    # vLLM v1 (and the default engine): the lowest-priority, most recently admitted running
    # sequence is recompute-preempted and re-queued at the front, until the growth fits.
    NEWEST_FRONT = "newest_front"
    # transformers CB (OffloadingManager.offload_requests): only sequences that could not get
    # their block this step are victims, newest first, never the last running one; a victim
    # re-queues at the back of the waiting queue, and no queued request is admitted until a
    # running one finishes (scheduler.block_new_requests).
    STARVED_BACK = "starved_back"


@dataclass
class EngineConfig(Sealed):
    """A real engine's rules that the batcher, KV and scheduler sections do not hold."""

    section: ClassVar[str | None] = "engine"
    name: str = bounded("default", nonempty=True)
    step_cost: StepCost = StepCost.ROOFLINE
    # FITTED: step time = sum of coefficient x feature (cost.engine_step.EngineStepFit).
    const_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    q_padded_token_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    kv_read_token_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    kv_read_token2_us: float = bounded(0.0, ge=0, le=MAX_COST_US)  # per (10^3 KV tokens read)^2
    seqlen_us: float = bounded(0.0, ge=0, le=MAX_COST_US)  # per token of the longest sequence
    # per unit of longest sequence / sqrt(requests)
    seqlen_per_sqrt_request_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    # per 10^3 (prefill x longest sequence) pairs
    prefill_seqlen_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    request_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    q_pad_tokens: int = bounded(
        256, gt=0, le=MAX_INT, integer=True
    )  # queries padded to a multiple of this
    # KV tokens a step reads padded to a multiple of this (transformers: kv_padding_interval_size
    # under CUDA graphs); 0: unpadded.
    kv_pad_tokens: int = bounded(0, ge=0, le=MAX_INT, integer=True)
    graph_mode: GraphMode = GraphMode.NONE
    graph_capture_us: int = bounded(
        0, ge=0, le=MAX_COST_US, integer=True
    )  # one lazy capture's stall (LAZY)
    graph_captures_per_shape: int = bounded(
        1, gt=0, le=MAX_INT, integer=True
    )  # LAZY: IO buffer sets
    # Pinned CPU swap space of the engine, in KV blocks of kv.block_tokens (transformers:
    # cpu_offload_space): a preempted request's blocks are copied out over the PCIe link and
    # back on resume instead of recomputed, while they fit; 0: recompute (soft reset)
    # (components/cpu_swap.py).
    cpu_swap_blocks: int = bounded(0, ge=0, le=MAX_INT, integer=True)
    # The GPU this profile's step cost was measured on (the engine.json `gpu` of its captures);
    # empty: not tied to one GPU (the roofline engine, which scales by the hardware section).
    fitted_on: str = ""
    # The engine.json settings the step cost was measured at (validation/engine_settings.py
    # refuses a capture made at another value unless the step cost represents it), spelled as
    # engine_settings.normalised writes them: {"q_padding_interval_size": "256", ...}.
    fitted_settings: dict[str, str] = field(default_factory=dict)
    # Time of each padded query shape k x q_pad_tokens (k = 1..len), replacing const_us +
    # q_padded_token_us x padded queries when given (cost.engine_step.EngineStepFit.q_shape_us).
    q_shape_us: list[float] = field(default_factory=list)
    # PHYSICAL: the GPU micro-profile (kernels/profile_gpu.py's gpu_profile.json); a relative path
    # is looked up under the package's conf/ folder, then the repository root.
    gpu_profile: str = ""
    # PHYSICAL: the engine's constants over the physical terms (cost.step_physical.PhysicalFit):
    # per-step and per-request overhead (us), a scale of each kernel time on the profile, and
    # ns per attention query tile launched (padding slots included).
    physical_overhead_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_request_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_gemm_scale: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_kv_copy_scale: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_attention_scale: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_elementwise_scale: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_grid_block_ns: float = bounded(0.0, ge=0, le=MAX_COST_US)
    physical_kernels: PhysicalKernels = PhysicalKernels.HF_CB
    # vLLM: an eager step's host floor (us; cost.step_physical.PhysicalFit.eager_floor_us) and the
    # CUDA-graph capture sizes a uniform decode step is padded to (cudagraph_capture_sizes).
    physical_eager_floor_us: float = bounded(0.0, ge=0, le=MAX_COST_US)
    graph_sizes: list[int] = field(default_factory=list)
    # KV pool in blocks of kv.block_tokens, as the engine allocated it; 0: from vram_gb.
    kv_pool_blocks: int = bounded(0, ge=0, le=MAX_INT, integer=True)
    # Async batching: step n+1 is scheduled while step n runs, so a request that arrived during a
    # step sits out the next one, and a finished request still takes a decode slot (and its KV
    # read) in the step after its last token.
    async_scheduling: bool = False
    # Async scheduling: a request that produced its last token still takes a decode slot in the
    # next step, which was composed before it finished (transformers CB). False: the engine knew
    # the request would end (its length cap) and left it out (vLLM 0.26 Scheduler.schedule skips
    # a running request once `num_computed_tokens + 2 - num_output_placeholders` reaches
    # prompt + max_tokens); the replays end every request at its length cap.
    async_finish_slot: bool = True
    # vLLM 0.26 under async scheduling: a step's outputs (first tokens, finishes) reach the client
    # only once the next step is launched, which for an eager step (no CUDA graph: a prefill chunk,
    # or more decodes than the largest of graph_sizes) is about that step's end
    # (EngineCore.step_with_batch_queue; components/output_lag.py). False: at the step's end.
    output_after_next_launch: bool = False
    # vLLM's AsyncLLM front end (another process than the engine core): a request reaches the
    # scheduler frontend_in_us + frontend_in_token_us x prompt tokens after it is sent, and every
    # output reaches the client frontend_out_us after the engine core took it; 0: at once.
    frontend_in_us: float = bounded(0.0, ge=0)
    frontend_in_token_us: float = bounded(0.0, ge=0)
    frontend_out_us: int = bounded(0, ge=0, integer=True)
    # A step whose running sequences' growth preempted one still admits queued requests; False:
    # it admits none (vLLM v1 schedules the waiting queue only `if not preempted_reqs`).
    admit_after_preemption: bool = True
    # While free KV (idle cached blocks included) is under this fraction of the pool, no new
    # request is admitted next to running ones (transformers' safety_margin; the engine also holds
    # back split prefills then, which with whole-prompt allocation here starved admission); 0: off.
    prefill_margin_fraction: float = bounded(0.0, ge=0, lt=1)
    preemption: Preemption = Preemption.NEWEST_FRONT
    # A queued request whose KV does not fit is passed over for later ones while a block is free
    # (transformers CB: `continue` in Scheduler._process_candidates); False: head-of-line order.
    admit_past_blocked: bool = False
    # Running sequences take their next KV block before queued requests are admitted at a step
    # boundary (transformers CB: decoding requests come first among a step's candidates).
    grow_before_admit: bool = False
    # KV room a prompt is given beyond its tokens at admission: transformers allocates
    # (n + 1) // block + 1 blocks for n new tokens, room for n + 2 (the first decode step's
    # token, and the next one's, composed while the first runs under async batching); 0: n.
    prompt_room_tokens: int = bounded(0, ge=0, le=MAX_INT, integer=True)
    # An admission that cannot get all its blocks, even by evicting every idle one, evicts none
    # (transformers and vLLM check before they reclaim cached blocks); False: eviction starts for
    # a request that still has to wait (the default engine, which offloads ahead of admission).
    atomic_admission: bool = False
    # A step reads at most the pool's tokens of cached KV, each request its whole past (a shared
    # prefix once per request): one that does not fit sits the step out, the waiting ones
    # included (transformers CB: `cache_budget = num_pages` in Scheduler._process_candidates;
    # components/read_budget.py); False: a step reads any amount (vLLM's paged attention).
    kv_read_cap: bool = False

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            all(isinstance(v, int) and v > 0 for v in self.graph_sizes),
            join_key(prefix, "graph_sizes"),
            list(self.graph_sizes),
            "must hold positive token counts (vLLM's cudagraph_capture_sizes)",
        )
        require(
            all(0 < v <= MAX_COST_US for v in self.q_shape_us),
            join_key(prefix, "q_shape_us"),
            list(self.q_shape_us),
            f"must hold positive step times (us, at most {MAX_COST_US:g}), one per padded "
            "query shape",
        )
        if self.step_cost == StepCost.FITTED:
            costs = [getattr(self, k) for k in FITTED_COST_KEYS] + list(self.q_shape_us)
            require(
                any(c > 0 for c in costs),
                join_key(prefix, "step_cost"),
                self.step_cost.value,
                f"a fitted step cost needs a positive coefficient ({', '.join(FITTED_COST_KEYS)} "
                "or q_shape_us): with every one 0 each request finishes in 0 us",
            )
        require(
            self.graph_mode != GraphMode.LAZY or self.graph_capture_us > 0,
            join_key(prefix, "graph_capture_us"),
            self.graph_capture_us,
            "graph_mode=lazy needs the stall one capture adds (us, > 0): 0 makes captures free",
        )
        if self.step_cost == StepCost.PHYSICAL:
            require(
                bool(self.gpu_profile),
                join_key(prefix, "gpu_profile"),
                self.gpu_profile,
                "step_cost=physical needs the GPU micro-profile it is built on (gpu_profile.json)",
            )
            require(
                self.physical_gemm_scale > 0,
                join_key(prefix, "physical_gemm_scale"),
                self.physical_gemm_scale,
                "must be > 0 for step_cost=physical (a step without its GEMMs is no fit)",
            )
            require(
                self.physical_attention_scale > 0,
                join_key(prefix, "physical_attention_scale"),
                self.physical_attention_scale,
                "must be > 0 for step_cost=physical (attention over a long context is not free)",
            )
        if self.step_cost != StepCost.ROOFLINE:
            require(
                bool(self.fitted_on),
                join_key(prefix, "fitted_on"),
                self.fitted_on,
                f"step_cost={self.step_cost.value} was measured on a GPU: name it (the `gpu` of "
                "the captures' engine.json)",
            )
