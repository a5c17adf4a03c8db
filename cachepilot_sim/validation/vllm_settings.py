"""A vLLM v1 capture's engine.json (`engine: vllm_v1`, experiments/validation/vllm/capture_vllm.py),
honoured or refused key by key for a replay on an engine=vllm_v1 profile (docs/vllm.md, "Rules
checked against vLLM 0.26")."""

from __future__ import annotations

from cachepilot_sim.config import StepCost
from cachepilot_sim.config.engine_profile import PhysicalKernels
from cachepilot_sim.validation.settings_reader import (
    ROOFLINE_NOTE,
    Reader,
    Setting,
    check_fitted,
    normalised,
    read_gpu,
    read_model,
)

VLLM_ENGINE = "vllm_v1"
# Records of a vLLM capture (experiments/validation/vllm/capture_vllm.py), not settings.
VLLM_RECORDS = frozenset(
    {
        "engine",
        "engine_spec",  # the arguments; the resolved values beside it are what is read
        "env",  # the VLLM_* environment; its effect is in model_runner and the settings
        "versions",
        "sm",
        "engine_init_s",
        "frontend",  # AsyncLLM or the in-process LLMEngine: client overhead, not modelled
        "command",
        "prefix_cache_cleared_before_run",
        "workload",
        "run",
        "workload_meta",
        "captured_at",
        "wall_s",
        "step_source",
        "num_preemptions",
        "gpu_memory_utilization",  # how vLLM sized num_gpu_blocks, which is read
        "prefix_caching_hash_algo",  # the hash function: equal prefixes hit either way
        "kv_offloading_backend",  # read with kv_offloading_size
        "gpu",  # read by _gpu: a preset, or a note that there is none
    }
)
# vLLM settings the replay models one way only: (key, required value, why another is refused).
VLLM_REQUIRED = (
    ("enable_prefix_caching", "true", "the replay always shares prefix blocks"),
    ("enable_chunked_prefill", "true", "the replay always chunks long prompts"),
    ("scheduling_policy", "fcfs", "only the FCFS scheduler's rules are modelled"),
    ("watermark", "0.0", "vLLM's admission watermark is not modelled"),
    (
        "scheduler_reserve_full_isl",
        "true",
        "the replay admits a request only when its whole prompt fits",
    ),
    ("long_prefill_token_threshold", "0", "a per-request prefill cap is not modelled"),
    ("dtype", "bfloat16", "the replayed model's KV is bf16 (model.kv_bytes_per_token)"),
)
# Settings the step cost depends on: checked against engine.fitted_settings when pinned.
VLLM_STEP_COST = (
    "compilation_mode",
    "cudagraph_mode",
    "enforce_eager",
    "model_runner",
    "attention_backend",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
)


def read_vllm(r: Reader) -> None:
    """A vLLM v1 capture: its scheduler limits and pool become overrides, the rules the replay
    models one way only are required, the step-cost settings are checked, the rest is a record
    (docs/vllm.md, "Rules checked against vLLM 0.26")."""
    e, cfg = r.engine, r.cfg
    if not cfg.engine.name.startswith(VLLM_ENGINE):
        raise r.fail(
            "engine", f"a vLLM capture is replayed with a {VLLM_ENGINE} profile, whose rules are "
            "vLLM's (--engine vllm_v1)"
        )  # fmt: skip
    size = r.positive("block_size")
    if size is not None:
        r.honour("block_size", size, f"kv.block_tokens={size}", f"replay.hash_block_tokens={size}")
    blocks = r.positive("num_gpu_blocks")
    if blocks is not None:
        if blocks < 2:
            raise r.fail("num_gpu_blocks", "must be at least 2 (vLLM keeps one as its null block)")
        # BlockPool takes one block as the null block: the rest hold KV
        r.honour("num_gpu_blocks", blocks, f"engine.kv_pool_blocks={blocks - 1}")
    if (v := r.positive("max_num_batched_tokens")) is not None:
        r.honour("max_num_batched_tokens", v, f"batcher.throughput_token_budget={v}")
    if (v := r.positive("max_num_seqs")) is not None:
        r.honour("max_num_seqs", v, f"batcher.throughput_max_seqs={v}")
    if (v := r.get("async_scheduling", bool)) is not None:
        r.honour("async_scheduling", v, f"engine.async_scheduling={normalised(v)}")
    for key, want, why in VLLM_REQUIRED:
        if key in e:
            got = normalised(e[key]).lower().removeprefix("schedulingpolicy.")
            if got != want:
                raise r.fail(key, why)
            r.out.settings.append(Setting(key, e[key], f"requires {want}"))
    # vLLM's own value: null is its "no offloading" (cache_config.kv_offloading_size), recorded
    offload = (
        None if e.get("kv_offloading_size") is None else r.get("kv_offloading_size", (int, float))
    )
    if offload:
        raise r.fail(
            "kv_offloading_size", "vLLM's CPU offloading (OffloadingConnector) is not modelled "
            f"by engine={cfg.engine.name} (kv.offload_enabled=false)"
        )  # fmt: skip
    if "kv_offloading_size" in e:
        r.out.settings.append(Setting("kv_offloading_size", offload, "no CPU offload"))
    if "max_model_len" in e:
        r.positive("max_model_len")
        r.out.settings.append(
            Setting("max_model_len", e["max_model_len"], "a length cap: vLLM refuses a longer "
                    "request at arrival, and a capture holds none")
        )  # fmt: skip
    fitted = cfg.engine.step_cost != StepCost.ROOFLINE
    graphs = read_graph_sizes(r)
    for key in VLLM_STEP_COST:
        if key not in e or key in graphs:
            continue
        if not fitted:
            r.out.settings.append(Setting(key, e[key], ROOFLINE_NOTE))
        elif not check_fitted(r, key, e[key], representable=False):
            r.out.settings.append(Setting(key, e[key], "not pinned by this profile"))
    read_model(r)
    read_gpu(r)
    known = VLLM_RECORDS | {s.key for s in r.out.settings} | {"model", "kv_bytes_per_token"}
    for key in e:
        if key not in known:
            raise r.fail(key, "not a setting this reader knows; it cannot be replayed or ignored")


def read_graph_sizes(r: Reader) -> tuple[str, ...]:
    """The CUDA-graph capture sizes, which a physical step cost of vLLM's kernels prices at any
    value (cost/step_physical.py: a uniform decode step is padded to the next one): honoured.
    The keys read here; none for another step cost (they are then checked as fitted settings)."""
    e, engine = r.engine, r.cfg.engine
    if engine.step_cost != StepCost.PHYSICAL or engine.physical_kernels != PhysicalKernels.VLLM:
        return ()
    sizes = e.get("cudagraph_capture_sizes")
    if sizes is None:
        return ()
    if not isinstance(sizes, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes
    ):
        raise r.fail("cudagraph_capture_sizes", "must be a list of positive integers")
    top = e.get("max_cudagraph_capture_size")
    if top is not None and top != max(sizes, default=0):
        raise r.fail(
            "max_cudagraph_capture_size",
            f"must be the largest of cudagraph_capture_sizes ({max(sizes, default=0)}): vLLM "
            "captures no size above it",
        )
    listed = ",".join(str(v) for v in sorted(sizes))
    r.honour("cudagraph_capture_sizes", sizes, f"engine.graph_sizes=[{listed}]")
    if top is not None:
        r.out.settings.append(
            Setting("max_cudagraph_capture_size", top, "the largest capture size (read above)")
        )
    return ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
