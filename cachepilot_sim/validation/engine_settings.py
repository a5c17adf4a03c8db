"""The engine settings of a ground truth (its `engine.json`), honoured or refused for a replay.

Every key a capture of transformers continuous batching writes is one of three kinds:

- a setting the simulator honours: it becomes a config override (the token budget, the request
  cap, blocks and block size, the safety margin, async batching, the query and KV padding, the
  graph mode, the CPU swap space);
- a setting the engine profile's step cost was measured at (`engine.fitted_settings`): a capture
  made with another value is refused, unless the profile's step cost represents that setting
  (the physical step cost takes any padding);
- a record of the run (versions, times, the workload, what happened): read by nothing.

A key the reader does not know is refused: it may be a setting, and a setting the model cannot
represent is never silently ignored. Every refusal is one line naming the file and the key.
A vLLM v1 capture (`engine: vllm_v1`, experiments/validation/vllm/capture_vllm.py) is read the
same way with vLLM's keys (validation/vllm_settings.py): its limits and pool honoured, the rules
the replay models one way only required, its step-cost settings checked, its records listed.
Captures of other engines (converted vLLM or SGLang benchmark files, hand-made folders) carry
the benchmark's own keys: their block size and pool are honoured and the rest is listed as not
read, so `validate` prints what it replayed and what it did not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cachepilot_sim.config import RunConfig, StepCost
from cachepilot_sim.validation.engine_behaviour import graph_and_swap_overrides
from cachepilot_sim.validation.settings_reader import (  # noqa: F401 (re-exported)
    DEVICE_PRESETS,
    ENGINE_FILE,
    PRESET_VRAM_GB,
    ROOFLINE_NOTE,
    EngineSettingsError,
    Reader,
    ResolvedSettings,
    Setting,
    check_fitted,
    normalised,
    read_gpu,
    read_gpu_name,
    read_model,
    read_pool,
)
from cachepilot_sim.validation.vllm_settings import VLLM_ENGINE, read_vllm

HF_ENGINE = "transformers-continuous-batching"
# Records of the run, not settings: read by nothing (transformers captures).
HF_RECORDS = frozenset(
    {
        "engine",
        "engine_spec",
        "max_memory_percent",  # how the engine sized num_blocks, which is read
        "versions",
        "engine_init_s",
        "precaptured_graphs",
        "precapture_skipped",
        "precapture_s",
        "precapture_keys_per_pair",
        "driver",
        "workload",
        "run",
        "captured_at",
        "workload_meta",
        "wall_s",
        "graph_captures_during_run",
        "preemption_events",
        "prefix_cache_cleared_before_run",
        "command",
        "scheduler",  # the class name of scheduler_type, which is read
        "cpu_offload_space_gib",  # num_cpu_blocks, which is read, in GiB
        "gpu",  # compared with engine.fitted_on: a transfer is reported, not refused
        "policy_hook",  # the policy hook's counters (experiments/validation/policy_hook.py)
        "kv_traffic",  # tokens prefilled, hit, recomputed, swapped per run
    }
)
ENGINE_ORDER = "none"  # engine.json `policy`: the engine's own reuse order, no hook


def _hf(r: Reader) -> None:
    e, cfg = r.engine, r.cfg
    physical = str(cfg.engine.step_cost) == "physical"  # takes any padding
    fitted = cfg.engine.step_cost != StepCost.ROOFLINE
    read_pool(r)
    _read_cap(r)
    if (v := r.positive("max_batch_tokens")) is not None:
        r.honour("max_batch_tokens", v, f"batcher.throughput_token_budget={v}")
    if (v := r.positive("max_requests_per_batch")) is not None:
        r.honour("max_requests_per_batch", v, f"batcher.throughput_max_seqs={v}")
    margin = r.get("safety_margin", (int, float))
    if margin is not None:
        if not 0 <= margin < 1:
            raise r.fail("safety_margin", "must be in [0, 1)")
        r.honour("safety_margin", margin, f"engine.prefill_margin_fraction={margin}")
    if (v := r.get("use_async_batching", bool)) is not None:
        r.honour("use_async_batching", v, f"engine.async_scheduling={normalised(v)}")
    for key, field_name in (
        ("q_padding_interval_size", "q_pad_tokens"),
        ("kv_padding_interval_size", "kv_pad_tokens"),
    ):
        v = r.get(key, int)
        if v is None:
            continue
        if v < 0:
            raise r.fail(key, "must be >= 0")
        if not fitted:
            r.out.settings.append(Setting(key, v, ROOFLINE_NOTE))
            continue
        if check_fitted(r, key, v, representable=physical):
            continue
        if key.startswith("q_") and v == 0:
            raise r.fail(key, "unpadded queries (graphs off) are not modelled")
        r.honour(key, v, f"engine.{field_name}={v}")
    _swap(r)
    _policy(r)
    _graphs(r, fitted)
    for key, want, why in (
        ("scheduler_type", "fifo", "only the FIFO scheduler's rules are modelled"),
        ("use_prefix_sharing", "true", "the replay always shares prefix blocks"),
        ("allow_block_sharing", "true", "the replay always shares prefix blocks"),
        ("decode_fast_path", "false", "the decode fast path is not modelled"),
        ("max_blocks_per_request", "0", "the decode fast path is not modelled"),
        ("compile", "false", "a torch.compile'd engine is not modelled"),
    ):
        if key in e:
            if normalised(e[key]) != want:
                raise r.fail(key, why)
            r.out.settings.append(Setting(key, e[key], f"requires {want}"))
    attn = e.get("attn_implementation")
    if attn is not None and not check_fitted(r, "attn_implementation", attn, representable=False):
        use = ROOFLINE_NOTE if not fitted else "not pinned by this profile"
        r.out.settings.append(Setting("attn_implementation", attn, use))
    read_model(r)
    read_gpu(r)
    known = HF_RECORDS | {s.key for s in r.out.settings} | {"model", "kv_bytes_per_token"}
    known |= {"use_cuda_graph", "num_cpu_blocks"}
    for key in e:
        if key not in known:
            raise r.fail(key, "not a setting this reader knows; it cannot be replayed or ignored")


def _read_cap(r: Reader) -> None:
    """`num_pages` (num_blocks x block_size) is also each step's KV read cap (cache_budget)."""
    pages = r.positive("num_pages")
    if pages is None:
        return
    blocks, size = r.engine.get("num_blocks"), r.engine.get("block_size")
    if isinstance(blocks, int) and isinstance(size, int) and pages != blocks * size:
        raise r.fail("num_pages", f"must be num_blocks x block_size = {blocks * size}")
    r.honour("num_pages", pages, "engine.kv_read_cap=true")


def _graphs(r: Reader, fitted: bool) -> None:
    """use_cuda_graph (one flag per path, or one) and whether the graphs were captured before
    serving (precaptured_graphs) or lazily during it."""
    e = r.engine
    if "use_cuda_graph" not in e:
        return
    flags = e["use_cuda_graph"]
    flags = flags if isinstance(flags, list) else [flags]
    if not flags or not all(isinstance(f, bool) for f in flags):
        raise r.fail("use_cuda_graph", "expected true/false or a list of them")
    if not fitted:
        r.out.settings.append(Setting("use_cuda_graph", e["use_cuda_graph"], ROOFLINE_NOTE))
        return
    if not any(flags):
        if fitted:
            raise r.fail(
                "use_cuda_graph", "an eager engine is host-bound: this step cost was measured "
                "with CUDA graphs"
            )  # fmt: skip
        r.honour("use_cuda_graph", e["use_cuda_graph"], "engine.graph_mode=NONE")
        return
    graph = [o for o in _behaviour(r) if not o.startswith("engine.cpu_swap_blocks")]
    if "engine.graph_mode=LAZY" in graph and not r.cfg.engine.graph_capture_us:
        raise r.fail(
            "use_cuda_graph", "graphs captured lazily stall the engine, and this profile has no "
            "capture cost (engine.graph_capture_us: fit one with fit_capture_cost on other runs)"
        )  # fmt: skip
    r.honour("use_cuda_graph", e["use_cuda_graph"], *graph)


def _behaviour(r: Reader) -> list[str]:
    """validation/engine_behaviour.py's overrides, its errors as this file's one line."""
    try:
        return graph_and_swap_overrides(r.engine, r.cfg.kv.block_tokens)
    except ValueError as err:
        raise EngineSettingsError(f"{r.file}: {err}") from None


def _swap(r: Reader) -> None:
    """CPU swap of preempted requests (num_cpu_blocks, or cpu_offload_space_gib): swapped out
    and back over the link, not recomputed (components/cpu_swap.py)."""
    blocks = r.get("num_cpu_blocks", int)
    if blocks is not None and blocks < 0:
        raise r.fail("num_cpu_blocks", "must be >= 0")
    swap = [o for o in _behaviour(r) if o.startswith("engine.cpu_swap_blocks")]
    if swap == ["engine.cpu_swap_blocks=0"]:
        r.out.settings.append(Setting("num_cpu_blocks", 0, "no swap (recompute)"))
    elif swap:
        r.honour("num_cpu_blocks", r.engine.get("num_cpu_blocks"), *swap)


def _policy(r: Reader) -> None:
    """The cached-block reuse order the capture ran (`capture.py --policy`): a simulator policy
    is replayed as that policy; the engine's own order as the profile's (mru, which cuts chain
    tails only: an inner block the engine evicted is noted)."""
    name = r.get("policy", str)
    if name is None:
        return
    if name == ENGINE_ORDER:
        r.out.settings.append(Setting("policy", name, f"the profile's {r.cfg.policy.name}"))
        hook = r.engine.get("policy_hook")
        inner = hook.get("inner_evictions") if isinstance(hook, dict) else None
        if inner:
            r.out.notes.append(
                f"the engine's own order evicted {inner} inner blocks (blocks a cached block "
                "extends); the replay cuts chain tails only"
            )
        return
    from cachepilot_sim.config.policy import known_policies

    if name not in known_policies():
        raise r.fail("policy", f"not a policy the simulator knows ({', '.join(known_policies())})")
    r.honour("policy", name, f"policy={name}")


def resolve(path: Path, engine: dict[str, Any], cfg: RunConfig) -> ResolvedSettings:
    """The overrides and the account of `engine` (the engine.json of the ground truth at `path`)
    for a replay on the profile `cfg`; EngineSettingsError for a setting it cannot replay."""
    r = Reader(path, engine, cfg)
    if engine.get("engine") == HF_ENGINE:
        _hf(r)
        return r.out
    if engine.get("engine") == VLLM_ENGINE:
        read_vllm(r)
        return r.out
    read_pool(r)
    margin = r.get("safety_margin", (int, float))
    if margin is not None:
        if not 0 <= margin < 1:
            raise r.fail("safety_margin", "must be in [0, 1)")
        r.honour("safety_margin", margin, f"engine.prefill_margin_fraction={margin}")
    r.out.gpu = read_gpu_name(r)
    read = {s.key for s in r.out.settings}
    for key, value in engine.items():
        if key not in read and key != "engine":
            r.out.settings.append(Setting(key, value, "not read (not a transformers capture)"))
    return r.out
