"""One documented engine configuration of transformers continuous batching, built and torn down.

`make_engine` builds the manager and its batch processor, instruments it and captures a CUDA graph
for every padded batch shape the configuration can produce (so serving never stalls on a lazy
capture); `engine_config` reads the resolved configuration back for engine.json."""

from __future__ import annotations

import gc
import math
import platform
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import hf_instrument
import torch
from hf_instrument import Recorder, instrument
from hf_model import LLAMA3_8B, TINY

perf_counter = time.perf_counter


@dataclass
class EngineSpec:
    """One engine configuration; everything else stays at the engine's defaults."""

    name: str
    num_blocks: int | None  # None: the engine sizes it (max_memory_percent of free memory)
    max_batch_tokens: int = 2048
    block_size: int = 256
    use_cuda_graph: bool = True
    use_async_batching: bool = True
    q_padding_interval_size: int = 256
    kv_padding_interval_size: int = 16384
    safety_margin: float | None = None  # None: the scheduler's default (FIFO: 0.15)
    cpu_offload_space_gib: float = 0.0
    scheduler_type: str = "fifo"
    precapture_max_seqlen_k: int = 4096  # 0: no pre-capture (lazy graphs)


def make_engine(model: Any, spec: EngineSpec, rec: Recorder, smoke: bool) -> tuple[Any, dict]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    num_blocks = spec.num_blocks
    if smoke:  # the CPU smoke: a small pool (sdpa's mask grows with batch tokens x pool)
        num_blocks = min(num_blocks or 96, 96)
    cb = ContinuousBatchingConfig(
        block_size=spec.block_size,
        num_blocks=num_blocks,
        max_batch_tokens=spec.max_batch_tokens,
        use_cuda_graph=spec.use_cuda_graph,
        use_async_batching=spec.use_async_batching and not smoke,  # async needs CUDA
        q_padding_interval_size=spec.q_padding_interval_size if spec.use_cuda_graph else 0,
        kv_padding_interval_size=spec.kv_padding_interval_size if spec.use_cuda_graph else 0,
        safety_margin=spec.safety_margin,
        cpu_offload_space=0.0 if smoke else spec.cpu_offload_space_gib,  # pinned memory: CUDA
        scheduler_type=spec.scheduler_type,
        seed=0,
    )
    gen = GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=None)
    t = perf_counter()
    mgr = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    mgr.batch_processor = mgr._create_batch_processor()
    init_s = perf_counter() - t
    instrument(mgr, rec)
    info = {"engine_init_s": round(init_s, 3)}
    if torch.cuda.is_available():
        print(
            f"[engine {spec.name}] init {init_s:.1f} s, "
            f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated",
            flush=True,
        )
    if spec.use_cuda_graph and spec.precapture_max_seqlen_k and not smoke:
        info.update(precapture_graphs(mgr, spec))
    return mgr, info


def sweep_keys(
    spec: EngineSpec, num_pages: int, max_batch_tokens: int
) -> list[tuple[int, int, int]]:
    """Every padded (q, kv_read, max_seqlen_k) a batch can have, largest first (the graph pool then
    grows once). q: multiples of the q interval up to max_batch_tokens; kv_read: multiples of the kv
    interval up to num_pages; max_seqlen_k: powers of two from 1024, capped at num_pages."""
    iq, ikv = spec.q_padding_interval_size, spec.kv_padding_interval_size
    qs = sorted(
        {min(i * iq, max_batch_tokens) for i in range(1, math.ceil(max_batch_tokens / iq) + 1)}
    )
    kvs = sorted({min(i * ikv, num_pages) for i in range(1, math.ceil(num_pages / ikv) + 1)})
    ss, s = [], 1024
    while True:
        ss.append(min(s, num_pages))
        if s >= min(spec.precapture_max_seqlen_k, num_pages):
            break
        s *= 2
    keys = [(q, kv, sk) for q in qs for kv in kvs for sk in sorted(set(ss))]
    return sorted(keys, reverse=True)


def sweep_parts(q_pad: int, iq: int, sk: int) -> list[tuple[int, int]]:
    """(query, cached) token counts of fake requests whose padded key is (q_pad, *, sk)."""
    q_total = max(1, q_pad - iq // 2)
    length = 1000 if sk <= 1024 else (3 * sk) // 4
    first_q = min(q_total, length)
    parts = [(first_q, length - first_q)]
    rest = q_total - first_q
    while rest > 0:
        chunk = min(rest, min(length, 1000))
        parts.append((chunk, 0))
        rest -= chunk
    return parts


@torch.no_grad()
def precapture_graphs(mgr: Any, spec: EngineSpec) -> dict:
    """Capture one CUDA graph per reachable padded batch shape and IO pair before serving."""
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )

    bp = mgr.batch_processor
    cache, runner, ios = bp.cache, bp.model_runner, bp.inputs_and_outputs
    keys = sweep_keys(spec, cache.num_pages, cache.max_batch_tokens)
    pairs = 2 if hasattr(ios, "io_pairs") else 1
    t = perf_counter()
    captured = skipped = 0
    for _ in range(pairs):
        for q_pad, kv_pad, sk in keys:
            states = []
            for i, (q, kv) in enumerate(sweep_parts(q_pad, spec.q_padding_interval_size, sk)):
                st = RequestState(
                    request_id=f"__sweep_{i}__", initial_tokens=[0] * (q + kv), max_new_tokens=1
                )
                st._status = RequestStatus.PREFILLING
                st.tokens_to_process = [0] * q
                st.position_offset = kv
                if (
                    cache.allocate_blocks(math.ceil((q + kv) / cache.block_size), st.request_id, 0)
                    is None
                ):
                    break
                states.append(
                    FutureRequestState(st, has_new_token=True, complete_blocks=0, query_length=q)
                )
            try:
                if len(states) == len(sweep_parts(q_pad, spec.q_padding_interval_size, sk)):
                    ios.prepare_batch_tensors(
                        states, bp.logit_processor, False, q_pad, kv_pad, use_padding=True
                    )
                    runner.compute_batch(mgr.model, ios.get_model_kwargs(use_padding=True))
                    torch.cuda.synchronize()
                    captured += 1
                    if captured % 40 == 0:
                        print(
                            f"[precapture] {captured} graphs, {perf_counter() - t:.1f} s, "
                            f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated",
                            flush=True,
                        )
                else:
                    skipped += 1
            finally:
                for fs in states:
                    cache.free_blocks(fs.state.request_id)
        if pairs == 2:
            ios.swap_io_pairs()
    dur = perf_counter() - t
    print(
        f"[precapture] {captured} graphs ({skipped} skipped) over {len(keys)} keys x {pairs} "
        f"pairs in {dur:.1f} s",
        flush=True,
    )
    return {
        "precaptured_graphs": captured,
        "precapture_skipped": skipped,
        "precapture_s": round(dur, 2),
        "precapture_keys_per_pair": len(keys),
    }


def engine_config(mgr: Any, spec: EngineSpec, info: dict, smoke: bool) -> dict:
    """The resolved configuration, read back from the manager after init."""
    import transformers

    bp, cfg = mgr.batch_processor, mgr.continuous_batching_config
    cache, sched = bp.cache, bp.scheduler
    model_cfg = mgr.model.config
    kv_bytes_per_token = (
        2
        * model_cfg.num_hidden_layers
        * cache.num_key_value_heads
        * cache.head_dim
        * cache.dtype.itemsize
    )
    out = {
        "engine": "transformers-continuous-batching",
        "engine_spec": spec.name,
        "attn_implementation": model_cfg._attn_implementation,
        "block_size": cache.block_size,
        "num_blocks": cache.num_blocks,
        "num_pages": cache.num_pages,
        "max_batch_tokens": cache.max_batch_tokens,
        "max_requests_per_batch": cfg.max_requests_per_batch,
        "max_blocks_per_request": cfg.max_blocks_per_request,
        "decode_fast_path": cfg.max_blocks_per_request > 0,
        "scheduler": type(sched).__name__,
        "scheduler_type": cfg.scheduler_type,
        "safety_margin": sched.safety_margin,
        "use_cuda_graph": list(cfg.cuda_graph_booleans),
        "use_async_batching": bool(cfg.use_async_batching),
        "q_padding_interval_size": cfg.q_padding_interval_size,
        "kv_padding_interval_size": cfg.kv_padding_interval_size,
        "allow_block_sharing": cfg.allow_block_sharing,
        "use_prefix_sharing": bool(cache.use_prefix_sharing),
        "cpu_offload_space_gib": cfg.cpu_offload_space,
        "num_cpu_blocks": int(bp.offloading_manager._num_cpu_blocks),
        "max_memory_percent": cfg.max_memory_percent,
        "compile": cfg.varlen_compile_config is not None or cfg.decode_compile_config is not None,
        "kv_bytes_per_token": int(kv_bytes_per_token),
        "model": {
            **(TINY if smoke else LLAMA3_8B),
            "dtype": str(mgr.model.dtype).replace("torch.", ""),
            "weights": "random (AutoModelForCausalLM.from_config, seed 0)",
        },
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        **info,
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        try:
            out["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out["driver"] = None
    return out


def clear_prefix_cache(mgr: Any) -> None:
    """Forget every cached block: the engine keeps the hashes of freed blocks across sessions, so a
    second run of the same request list would hit the first run's prompts. Call it stopped."""
    from transformers.generation.continuous_batching.cache_manager import BlockManager

    cache = mgr.batch_processor.cache
    cache.free_all_requests()
    for cm in cache.group_cache_managers:
        cm.block_table.clear()
    cache._block_manager = BlockManager(
        cache.num_blocks, cache.block_size, tp_on=cache._block_manager.tp_on
    )


def destroy_engine(mgr: Any) -> None:
    try:
        if mgr.is_running():
            mgr.stop(block=True, timeout=30, keep_for_next_session=False)
        if getattr(mgr.model, "_cached_continuous_batching_manager", None) is mgr:
            delattr(mgr.model, "_cached_continuous_batching_manager")
        mgr.batch_processor = None
        mgr.destroy()
    finally:
        hf_instrument.detach()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
