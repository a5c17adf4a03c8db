#!/usr/bin/env python3
"""Ground-truth capture from the transformers continuous-batching engine (issue 12).

Runs on the lent H200 (torch 2.11, transformers 5.17, numpy, pyarrow; no simpy/polars/hydra there).
A random-weight Llama-3-8B-shaped model serves open-loop request lists through
`model.init_continuous_batching`; every engine step is instrumented by wrapping the engine's own
methods (no engine code is changed). Output: one ground-truth folder per workload and run
(`requests.parquet`, `steps.parquet`, `engine.json`, format in docs/validation.md), packed into
`$OUT/gt.tar.gz` after every run so a timeout still returns what was captured.

    python3 capture.py --out $OUT --phase explore      # fast path check, graphs vs eager spread
    python3 capture.py --out $OUT --phase main         # validation workloads, each run twice
    python3 capture.py --out $OUT --phase pressure     # small-cache workloads + cost micro-runs
    python3 capture.py --out /tmp/x --phase smoke --cpu-smoke   # tiny model on CPU, logic only

Engine configuration (one, documented in the README next to the data): FA2-varlen attention through
PyTorch's own FlashAttention-2 kernel, CUDA graphs + async batching on, every padded batch shape
captured before serving (`precapture_graphs`), so serving never stalls on a lazy capture.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import heapq
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

perf_counter = time.perf_counter

LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
# The name must contain "flash" (the engine then uses no mask, and turns graphs + async on) and
# must not match "flash.*2|3" (the engine would then look for flash_attn_with_kvcache, absent here).
FAST_ATTN = "paged|torch_flash_varlen"
TOKEN_LOW, TOKEN_HIGH = 1000, 120000


# --------------------------------------------------------------------------------------------- #
# Attention fast path: the engine's flash varlen path, with torch's built-in FA2 varlen kernel.  #
# --------------------------------------------------------------------------------------------- #
def torch_flash_varlen_paged(
    module: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: Any,
    cache: Any = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: Any = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: Any = 0,
    block_table: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Mirror of transformers/integrations/flash_paged.py (varlen branch): write the new K/V into
    the paged cache and read back each request's whole K/V through `cache.update`, then run causal
    varlen attention (bottom-right aligned, GQA) with torch.ops.aten._flash_attention_forward."""
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k = cu_seq_lens_k["full_attention"]
        max_seqlen_k = max_seqlen_k["full_attention"]
    k, v = cache.update(
        key_states=k,
        value_states=v,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    out = torch.ops.aten._flash_attention_forward(
        q.transpose(1, 2).squeeze(0).contiguous(),
        k.contiguous(),
        v.contiguous(),
        cu_seq_lens_q.to(torch.int32),
        cu_seq_lens_k.to(torch.int32).clone(),
        max_seqlen_q,
        max_seqlen_k,
        0.0,
        True,
        False,
        scale=module.scaling,
    )
    return out[0], None


def check_fast_path(device: str) -> dict:
    """Max abs error of torch's FA2 varlen kernel vs per-sequence SDPA (random bf16, GQA, q < k)."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 32, 8, 128
    q_lens, k_lens = [5, 64, 1, 200], [300, 64, 1000, 200]
    q = torch.randn(sum(q_lens), heads, dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(sum(k_lens), kv_heads, dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cq = torch.tensor(np.cumsum([0, *q_lens]), dtype=torch.int32, device=device)
    ck = torch.tensor(np.cumsum([0, *k_lens]), dtype=torch.int32, device=device)
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cq, ck, max(q_lens), max(k_lens), 0.0, True, False, scale=dim**-0.5
    )[0]
    err = 0.0
    for i, (lq, lk) in enumerate(zip(q_lens, k_lens, strict=True)):
        qi = q[cq[i] : cq[i + 1]].float().transpose(0, 1)
        ki = k[ck[i] : ck[i + 1]].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        vi = v[ck[i] : ck[i + 1]].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        mask = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)
        ref = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask)
        err = max(err, (out[cq[i] : cq[i + 1]].float() - ref.transpose(0, 1)).abs().max().item())
    return {"fa2_varlen_max_abs_err_vs_sdpa": err}


# --------------------------------------------------------------------------------------------- #
# Model and engine                                                                              #
# --------------------------------------------------------------------------------------------- #
def build_model(smoke: bool) -> Any:
    from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig

    AttentionInterface.register(FAST_ATTN, torch_flash_varlen_paged)
    shape = TINY if smoke else LLAMA3_8B
    cfg = LlamaConfig(**shape, attn_implementation="sdpa")
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    # Set directly: set_attn_implementation would try to load a hub kernel for a "flash" name.
    model.config._attn_implementation = "paged|sdpa" if smoke else FAST_ATTN
    return model


@dataclass
class EngineSpec:
    """One engine configuration; everything else stays at the engine's defaults."""

    name: str
    num_blocks: int
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


class Recorder:
    """Collects per-step and per-request timings from wrapped engine methods (host perf_counter)."""

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda
        self.t0 = perf_counter()
        self.active = False
        self.steps: list[dict] = []
        self.captures: list[dict] = []
        self.preemptions: list[dict] = []
        self.token_times: dict[str, list[float]] = defaultdict(list)
        self.num_soft_resets: dict[str, int] = defaultdict(int)
        self.num_cpu_swaps: dict[str, int] = defaultdict(int)
        self.num_restores: dict[str, int] = defaultdict(int)
        self.prefix_hit: dict[str, int] = {}
        self.batch: dict | None = None
        self.iter_times: dict[str, float] = {}
        self.events: list[tuple[int, Any, Any]] = []

    def begin(self) -> None:
        self.__init__(self.use_cuda)  # type: ignore[misc]
        self.active = True

    def rel_us(self, t: float) -> int:
        return int(round((t - self.t0) * 1e6))


REC: Recorder | None = None


def instrument(manager: Any, rec: Recorder) -> None:
    """Wrap the engine's step pieces (instance attributes, so only this manager is affected)."""
    from transformers.generation.continuous_batching.requests import RequestState, RequestStatus

    global REC
    REC = rec
    bp = manager.batch_processor
    sched, cache, runner, ios = bp.scheduler, bp.cache, bp.model_runner, bp.inputs_and_outputs
    offl = bp.offloading_manager

    if not getattr(RequestState, "_cp_patched", False):
        orig_update = RequestState.update_and_check_completion

        def update_and_check_completion(self, token_id, logprob):  # type: ignore[no-untyped-def]
            t = perf_counter()
            n_before = len(self.generated_tokens)
            done = orig_update(self, token_id, logprob)
            if REC is not None and REC.active and len(self.generated_tokens) > n_before:
                REC.token_times[self.request_id].append(t)
            return done

        RequestState.update_and_check_completion = update_and_check_completion
        RequestState._cp_patched = True

    orig_schedule = sched.schedule_batch

    def schedule_batch(token_budget, cache_budget):  # type: ignore[no-untyped-def]
        before = {rid: st.status for rid, st in sched.active_requests.items()}
        offloaded = {rid for rid, st in sched.waiting_requests.items() if st.is_cpu_offloaded}
        res = orig_schedule(token_budget, cache_budget)
        reqs = res[0]
        if reqs and rec.active:
            b = dict(
                num_requests=len(reqs),
                num_prefill_requests=0,
                num_decode_requests=0,
                prefill_tokens=0,
                decode_tokens=0,
                num_new_requests=0,
                prefix_hit_tokens=0,
                num_restores=0,
                q_tokens=int(res[2]),
                kv_read_tokens=int(res[3]),
                max_seqlen_k=0,
            )
            for fs in reqs:
                st, ql = fs.state, fs.query_length
                b["max_seqlen_k"] = max(b["max_seqlen_k"], st.position_offset + ql)
                if before.get(st.request_id) == RequestStatus.DECODING:
                    b["num_decode_requests"] += 1
                    b["decode_tokens"] += ql
                    continue
                b["num_prefill_requests"] += 1
                b["prefill_tokens"] += ql
                if st.request_id not in before:
                    b["num_new_requests"] += 1
                    if st.request_id in offloaded:
                        b["num_restores"] += 1
                        rec.num_restores[st.request_id] += 1
                    elif st.position_offset > 0:
                        b["prefix_hit_tokens"] += st.position_offset
                    if st.request_id not in rec.prefix_hit:
                        rec.prefix_hit[st.request_id] = int(st.position_offset)
            b["kv_blocks_in_use"] = cache.num_blocks - cache.get_num_free_blocks()
            b["num_waiting"] = len(sched.waiting_requests)
            b["num_active"] = len(sched.active_requests)
            rec.batch = b
        return res

    sched.schedule_batch = schedule_batch

    orig_pad = runner.maybe_pad_inputs

    def maybe_pad_inputs(num_q_tokens, max_kv_read, use_decode_fast_path):  # type: ignore[no-untyped-def]
        q, kv = orig_pad(num_q_tokens, max_kv_read, use_decode_fast_path)
        if rec.batch is not None:
            rec.batch["q_tokens_padded"] = int(q)
            rec.batch["kv_read_padded"] = int(kv)
        return q, kv

    runner.maybe_pad_inputs = maybe_pad_inputs

    orig_capture = runner._capture_graph

    def _capture_graph(forward_fn, compute_stream, *args):  # type: ignore[no-untyped-def]
        pair = getattr(ios, "current_pair", 0)
        dev_io = ios.io_pairs[pair].device_io if hasattr(ios, "io_pairs") else ios
        key = list(dev_io._get_graph_key())
        t = perf_counter()
        orig_capture(forward_fn, compute_stream, *args)
        torch.cuda.synchronize()
        dur = perf_counter() - t
        rec.captures.append(dict(t_us=rec.rel_us(t), dur_us=int(dur * 1e6), key=key, pair=pair))
        if rec.batch is not None:
            rec.batch["graph_captures"] = rec.batch.get("graph_captures", 0) + 1
            rec.batch["capture_us"] = rec.batch.get("capture_us", 0) + int(dur * 1e6)

    runner._capture_graph = _capture_graph

    orig_compute = runner.compute_batch

    def compute_batch(model, batch_data):  # type: ignore[no-untyped-def]
        if not (rec.use_cuda and rec.active and rec.batch is not None):
            return orig_compute(model, batch_data)
        stream = ios.compute_stream or torch.cuda.current_stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        orig_compute(model, batch_data)
        e1.record(stream)
        rec.batch["_events"] = (e0, e1)

    runner.compute_batch = compute_batch

    orig_offload = offl._offload_to_cpu

    def _offload_to_cpu(victims):  # type: ignore[no-untyped-def]
        blocks = {st.request_id: cache.blocks_in_use(st.request_id) for st in victims}
        swapped = orig_offload(victims)
        if rec.active:
            t_us = rec.rel_us(perf_counter())
            for st in victims:
                kind = "cpu_swap" if st.request_id in swapped else "soft_reset"
                counter = rec.num_cpu_swaps if kind == "cpu_swap" else rec.num_soft_resets
                counter[st.request_id] += 1
                rec.preemptions.append(
                    dict(
                        t_us=t_us,
                        request_id=st.request_id,
                        kind=kind,
                        blocks=blocks[st.request_id],
                        generated_tokens=len(st.generated_tokens),
                    )
                )
        return swapped

    offl._offload_to_cpu = _offload_to_cpu

    orig_prepare = bp.prepare_next_batch

    def prepare_next_batch():  # type: ignore[no-untyped-def]
        rec.batch = None
        ok = orig_prepare()
        rec.iter_times["prepare_end"] = perf_counter()
        return ok

    bp.prepare_next_batch = prepare_next_batch

    orig_update_batch = bp.update_batch

    def update_batch():  # type: ignore[no-untyped-def]
        rec.iter_times["update_start"] = perf_counter()
        orig_update_batch()

    bp.update_batch = update_batch

    orig_body = manager._generation_loop_body

    def body(batch_processor, bootstrapping):  # type: ignore[no-untyped-def]
        t_start = perf_counter()
        rec.iter_times = {}
        n_before = manager.current_batch
        cont = orig_body(batch_processor, bootstrapping)
        t_end = perf_counter()
        if rec.active and manager.current_batch != n_before and rec.batch is not None:
            b = rec.batch
            events = b.pop("_events", None)
            b["step"] = len(rec.steps)
            b["start_us"] = rec.rel_us(t_start)
            b["prepare_end_us"] = rec.rel_us(rec.iter_times.get("prepare_end", t_start))
            b["update_start_us"] = rec.rel_us(rec.iter_times.get("update_start", t_end))
            b["end_us"] = rec.rel_us(t_end)
            b["num_preemptions_total"] = len(rec.preemptions)
            b.setdefault("graph_captures", 0)
            b.setdefault("capture_us", 0)
            if events is not None:
                rec.events.append((b["step"], *events))
            rec.steps.append(b)
        return cont

    manager._generation_loop_body = body


def resolve_gpu_times(rec: Recorder) -> None:
    """Device time of each step's compute (CUDA events around compute_batch, compute stream)."""
    if not rec.use_cuda:
        return
    torch.cuda.synchronize()
    by_step = {s["step"]: s for s in rec.steps}
    for step, e0, e1 in rec.events:
        by_step[step]["gpu_us"] = int(e0.elapsed_time(e1) * 1000)
    rec.events = []


def make_engine(model: Any, spec: EngineSpec, rec: Recorder, smoke: bool) -> tuple[Any, dict]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    cb = ContinuousBatchingConfig(
        block_size=spec.block_size,
        num_blocks=spec.num_blocks,
        max_batch_tokens=spec.max_batch_tokens,
        use_cuda_graph=spec.use_cuda_graph,
        use_async_batching=spec.use_async_batching,
        q_padding_interval_size=spec.q_padding_interval_size if spec.use_cuda_graph else 0,
        kv_padding_interval_size=spec.kv_padding_interval_size if spec.use_cuda_graph else 0,
        safety_margin=spec.safety_margin,
        cpu_offload_space=spec.cpu_offload_space_gib,
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
    global REC
    try:
        if mgr.is_running():
            mgr.stop(block=True, timeout=30, keep_for_next_session=False)
        if getattr(mgr.model, "_cached_continuous_batching_manager", None) is mgr:
            delattr(mgr.model, "_cached_continuous_batching_manager")
        mgr.batch_processor = None
        mgr.destroy()
    finally:
        REC = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- #
# Workloads: request lists (open loop; a child turn goes think time after its parent's last token) #
# --------------------------------------------------------------------------------------------- #
@dataclass
class Req:
    request_id: str
    prompt_tokens: int  # roots: whole prompt; children: tokens appended to parent prompt + reply
    max_new_tokens: int
    send_s: float | None = None  # roots: send time from the workload start
    session_id: str | None = None
    parent_id: str | None = None
    turn: int = 0
    think_s: float = 0.0
    prefix_of: str | None = (
        None  # shares this many leading tokens with request `prefix_of` (microbench)
    )
    prefix_tokens: int = 0


def lognormal_lengths(
    rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int
) -> np.ndarray:
    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), lo, hi).astype(int)


MIXED = dict(
    prompt_median=512,
    prompt_sigma=0.8,
    prompt_lo=32,
    prompt_hi=2048,
    out_median=128,
    out_sigma=0.6,
    out_lo=16,
    out_hi=512,
)


def w_closed(name: str, n: int, prompt: int, out: int) -> list[Req]:
    return [Req(f"{name}-{i:04d}", prompt, out, send_s=0.0) for i in range(n)]


def w_poisson(
    name: str, n: int, rate: float, seed: int, lengths: dict = MIXED, t0: float = 0.0
) -> list[Req]:
    rng = np.random.default_rng(seed)
    times = t0 + np.cumsum(rng.exponential(1.0 / rate, n))
    p = lognormal_lengths(
        rng,
        n,
        lengths["prompt_median"],
        lengths["prompt_sigma"],
        lengths["prompt_lo"],
        lengths["prompt_hi"],
    )
    o = lognormal_lengths(
        rng, n, lengths["out_median"], lengths["out_sigma"], lengths["out_lo"], lengths["out_hi"]
    )
    return [
        Req(f"{name}-{i:04d}", int(p[i]), int(o[i]), send_s=float(times[i] - times[0]))
        for i in range(n)
    ]


def w_burst(
    name: str, base_rate: float, seed: int, phases: tuple = ((10.0, 1), (5.0, 4), (10.0, 1))
) -> list[Req]:
    """Poisson at base_rate, then 4x base_rate, then base_rate again (piecewise-constant rate)."""
    rng = np.random.default_rng(seed)
    times, t_start = [], 0.0
    for dur, mult in phases:
        t = t_start
        while True:
            t += rng.exponential(1.0 / (base_rate * mult))
            if t >= t_start + dur:
                break
            times.append(t)
        t_start += dur
    n = len(times)
    p = lognormal_lengths(
        rng,
        n,
        MIXED["prompt_median"],
        MIXED["prompt_sigma"],
        MIXED["prompt_lo"],
        MIXED["prompt_hi"],
    )
    o = lognormal_lengths(
        rng, n, MIXED["out_median"], MIXED["out_sigma"], MIXED["out_lo"], MIXED["out_hi"]
    )
    return [Req(f"{name}-{i:04d}", int(p[i]), int(o[i]), send_s=float(times[i])) for i in range(n)]


def w_multiturn(
    name: str, num_sessions: int, turns: int, session_rate: float, think_mean_s: float, seed: int
) -> list[Req]:
    """Sessions start Poisson; turn k>0 extends turn k-1's prompt + reply with new user tokens."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / session_rate, num_sessions))
    starts -= starts[0]
    reqs = []
    for s in range(num_sessions):
        sid = f"{name}-s{s:03d}"
        parent = None
        for k in range(turns):
            rid = f"{sid}-t{k}"
            new = int(rng.integers(384, 769)) if k == 0 else int(rng.integers(64, 257))
            out = int(rng.integers(64, 193))
            think = 0.0 if k == 0 else float(rng.exponential(think_mean_s))
            reqs.append(
                Req(
                    rid,
                    new,
                    out,
                    send_s=float(starts[s]) if k == 0 else None,
                    session_id=sid,
                    parent_id=parent,
                    turn=k,
                    think_s=think,
                )
            )
            parent = rid
    return reqs


def w_azure(name: str, rows: list[list[float]], stretch: float) -> list[Req]:
    """Azure LLM 2023 conv rows (t_s, context, generated), already clipped; gaps times `stretch`."""
    t_first = rows[0][0]
    return [
        Req(f"{name}-{i:04d}", int(c), int(g), send_s=(t - t_first) * stretch)
        for i, (t, c, g) in enumerate(rows)
    ]


# --------------------------------------------------------------------------------------------- #
# Client                                                                                        #
# --------------------------------------------------------------------------------------------- #
def token_ids(seed: int, key: str, n: int, smoke: bool) -> list[int]:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng([seed, h])
    hi = TINY["vocab_size"] - 1 if smoke else TOKEN_HIGH
    lo = 10 if smoke else TOKEN_LOW
    return rng.integers(lo, hi, size=n).tolist()


def run_requests(
    mgr: Any, rec: Recorder, reqs: list[Req], seed: int, smoke: bool, limit_s: float
) -> dict:
    """Send `reqs` open-loop and collect the results: per-request records and the wall time."""
    by_id = {r.request_id: r for r in reqs}
    children: dict[str, list[str]] = defaultdict(list)
    heap: list[tuple[float, int, str]] = []
    for i, r in enumerate(reqs):
        if r.parent_id is None:
            heap.append((float(r.send_s or 0.0), i, r.request_id))
        else:
            children[r.parent_id].append(r.request_id)
    heapq.heapify(heap)
    order = {r.request_id: i for i, r in enumerate(reqs)}
    prompts: dict[str, list[int]] = {}
    outputs: dict[str, Any] = {}
    planned: dict[str, float] = {}
    sent: dict[str, float] = {}
    rec.begin()
    t0 = rec.t0
    while len(outputs) < len(reqs):
        now = perf_counter() - t0
        if now > limit_s:
            print(
                f"[client] time limit {limit_s:.0f} s reached, "
                f"{len(reqs) - len(outputs)} unfinished",
                flush=True,
            )
            break
        while heap and heap[0][0] <= now:
            due, _, rid = heapq.heappop(heap)
            r = by_id[rid]
            if r.parent_id is None:
                ids = token_ids(seed, rid, r.prompt_tokens, smoke)
                if r.prefix_of is not None:
                    ids = prompts[r.prefix_of][: r.prefix_tokens] + ids[r.prefix_tokens :]
            else:
                par = outputs[r.parent_id]
                ids = (
                    prompts[r.parent_id]
                    + list(par.generated_tokens)
                    + token_ids(seed, rid, r.prompt_tokens, smoke)
                )
            prompts[rid] = ids
            planned[rid] = due
            sent[rid] = perf_counter()
            mgr.add_request(input_ids=ids, request_id=rid, max_new_tokens=r.max_new_tokens)
        wait = min(0.02, max(0.0, heap[0][0] - (perf_counter() - t0))) if heap else 0.05
        res = mgr.get_result(timeout=max(wait, 1e-4))
        if res is None:
            if not mgr.is_running():
                print("[client] engine thread died", flush=True)
                break
            continue
        if not res.is_finished():
            continue
        outputs[res.request_id] = res
        toks = rec.token_times.get(res.request_id)
        end_t = toks[-1] if toks else perf_counter()
        for cid in children.get(res.request_id, []):
            heapq.heappush(heap, (end_t - t0 + by_id[cid].think_s, order[cid], cid))
    wall_s = perf_counter() - t0
    rec.active = False
    records = []
    for r in reqs:
        rid = r.request_id
        out = outputs.get(rid)
        toks = rec.token_times.get(rid, [])
        status = "missing" if out is None else ("failed" if out.error is not None else "finished")
        records.append(
            dict(
                request_id=rid,
                session_id=r.session_id,
                parent_id=r.parent_id,
                turn=r.turn,
                think_time_us=int(round(r.think_s * 1e6)),
                planned_send_us=int(round(planned[rid] * 1e6)) if rid in planned else None,
                send_us=rec.rel_us(sent[rid]) if rid in sent else None,
                prompt_tokens=len(prompts[rid]) if rid in prompts else r.prompt_tokens,
                max_new_tokens=r.max_new_tokens,
                output_tokens=len(toks),
                first_token_us=rec.rel_us(toks[0]) if toks else None,
                end_us=rec.rel_us(toks[-1]) if toks else None,
                token_us=[rec.rel_us(t) for t in toks],
                status=status,
                error=None if out is None else out.error,
                engine_created_us=None if out is None else rec.rel_us(out.created_time),
                num_soft_resets=rec.num_soft_resets.get(rid, 0),
                num_cpu_swaps=rec.num_cpu_swaps.get(rid, 0),
                num_restores=rec.num_restores.get(rid, 0),
                prefix_hit_tokens=rec.prefix_hit.get(rid),
            )
        )
    return {"records": records, "wall_s": wall_s}


# --------------------------------------------------------------------------------------------- #
# Output                                                                                        #
# --------------------------------------------------------------------------------------------- #
REQUEST_TYPES = {
    "request_id": "string",
    "session_id": "string",
    "parent_id": "string",
    "turn": "int32",
    "think_time_us": "int64",
    "planned_send_us": "int64",
    "send_us": "int64",
    "prompt_tokens": "int32",
    "max_new_tokens": "int32",
    "output_tokens": "int32",
    "first_token_us": "int64",
    "end_us": "int64",
    "token_us": "list_int64",
    "status": "string",
    "error": "string",
    "engine_created_us": "int64",
    "num_soft_resets": "int32",
    "num_cpu_swaps": "int32",
    "num_restores": "int32",
    "prefix_hit_tokens": "int32",
}
STEP_TYPES = {
    "step": "int32",
    "start_us": "int64",
    "prepare_end_us": "int64",
    "update_start_us": "int64",
    "end_us": "int64",
    "gpu_us": "int64",
    "num_requests": "int32",
    "num_prefill_requests": "int32",
    "num_decode_requests": "int32",
    "num_new_requests": "int32",
    "prefill_tokens": "int32",
    "decode_tokens": "int32",
    "q_tokens": "int32",
    "q_tokens_padded": "int32",
    "kv_read_tokens": "int64",
    "kv_read_padded": "int64",
    "max_seqlen_k": "int32",
    "prefix_hit_tokens": "int32",
    "num_restores": "int32",
    "kv_blocks_in_use": "int32",
    "num_waiting": "int32",
    "num_active": "int32",
    "num_preemptions_total": "int32",
    "graph_captures": "int32",
    "capture_us": "int64",
}


def write_table(
    rows: list[dict], types: dict[str, str], path: Path, extra: dict | None = None
) -> None:
    """Parquet with pyarrow (explicit types) where available, else JSON lines (converted later)."""
    cols = {name: [row.get(name) for row in rows] for name in types}
    for k, v in (extra or {}).items():
        cols[k] = [v] * len(rows)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        def pa_type(t: str) -> Any:
            return {
                "string": pa.string(),
                "int32": pa.int32(),
                "int64": pa.int64(),
                "list_int64": pa.list_(pa.int64()),
            }.get(t, pa.string())

        arrays = {k: pa.array(v, type=pa_type(types.get(k, "string"))) for k, v in cols.items()}
        pq.write_table(pa.table(arrays), path.with_suffix(".parquet"), compression="zstd")
    except ImportError:
        with open(path.with_suffix(".jsonl"), "w") as f:
            for i in range(len(rows)):
                f.write(json.dumps({k: v[i] for k, v in cols.items()}) + "\n")


def pack(stage: Path, out: Path, name: str) -> None:
    tmp = out / f"{name}.partial"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(stage, arcname=stage.name)
    os.replace(tmp, out / f"{name}.tar.gz")


def summarize(records: list[dict], steps: list[dict], wall_s: float) -> dict:
    done = [r for r in records if r["status"] == "finished" and r["first_token_us"] is not None]
    ttft = [(r["first_token_us"] - r["send_us"]) / 1e3 for r in done]
    tpot = [
        (r["end_us"] - r["first_token_us"]) / 1e3 / (r["output_tokens"] - 1)
        for r in done
        if r["output_tokens"] > 1
    ]
    e2e = [(r["end_us"] - r["send_us"]) / 1e6 for r in done]
    span = (
        (max(r["end_us"] for r in done) - min(r["send_us"] for r in done)) / 1e6
        if done
        else float("nan")
    )
    toks = sum(r["output_tokens"] for r in done)
    return dict(
        requests=len(records),
        finished=len(done),
        wall_s=round(wall_s, 2),
        ttft_mean_ms=float(np.mean(ttft)) if ttft else None,
        ttft_p99_ms=float(np.percentile(ttft, 99)) if ttft else None,
        tpot_mean_ms=float(np.mean(tpot)) if tpot else None,
        tpot_p99_ms=float(np.percentile(tpot, 99)) if tpot else None,
        e2e_mean_s=float(np.mean(e2e)) if e2e else None,
        throughput_tok_s=toks / span if done else None,
        steps=len(steps),
        captures_serving=int(sum(s.get("graph_captures", 0) for s in steps)),
        soft_resets=int(sum(r["num_soft_resets"] for r in records)),
        cpu_swaps=int(sum(r["num_cpu_swaps"] for r in records)),
        step_ms_p50=float(np.median([(s["end_us"] - s["start_us"]) / 1e3 for s in steps]))
        if steps
        else None,
        gpu_ms_p50=float(np.median([s["gpu_us"] / 1e3 for s in steps if "gpu_us" in s]))
        if steps
        else None,
    )


@dataclass
class Session:
    out: Path
    stage: Path
    model: Any
    smoke: bool
    seed: int = 1234
    summaries: dict = field(default_factory=dict)

    def capture(
        self,
        mgr: Any,
        rec: Recorder,
        spec: EngineSpec,
        info: dict,
        name: str,
        reqs: list[Req],
        runs: int = 2,
        limit_s: float = 120.0,
        meta: dict | None = None,
        run_ids: tuple[int, ...] | None = None,
    ) -> list[dict]:
        """Run `reqs` once per run id on this engine (scheduler, cache, prefix cache and offload
        state reset before each run; pre-captured graphs kept); one ground-truth folder per run."""
        results = []
        for run in run_ids or tuple(range(1, runs + 1)):
            if mgr.is_running():
                mgr.stop(block=True, timeout=60, keep_for_next_session=True)
            clear_prefix_cache(mgr)
            mgr.start()
            res = run_requests(mgr, rec, reqs, self.seed, self.smoke, limit_s)
            mgr.stop(
                block=True,
                timeout=60,
                keep_for_next_session=True,
                hard_stop=len([r for r in res["records"] if r["status"] == "missing"]) > 0,
            )
            resolve_gpu_times(rec)
            folder = self.stage / name / f"run{run}"
            folder.mkdir(parents=True, exist_ok=True)
            write_table(res["records"], REQUEST_TYPES, folder / "requests")
            write_table(rec.steps, STEP_TYPES, folder / "steps")
            eng = engine_config(mgr, spec, info, self.smoke)
            eng.update(
                workload=name,
                run=run,
                captured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                workload_meta=meta or {},
                wall_s=round(res["wall_s"], 3),
                graph_captures_during_run=rec.captures,
                preemption_events=rec.preemptions,
                prefix_cache_cleared_before_run=True,
                command=" ".join(sys.argv),
            )
            (folder / "engine.json").write_text(json.dumps(eng, indent=1, default=str))
            summ = summarize(res["records"], rec.steps, res["wall_s"])
            self.summaries[f"{name}/run{run}"] = summ
            print(
                f"[{name} run{run}] "
                + json.dumps(
                    {k: (round(v, 2) if isinstance(v, float) else v) for k, v in summ.items()}
                ),
                flush=True,
            )
            pack(self.stage, self.out, "gt")
            (self.out / "summary.json").write_text(json.dumps(self.summaries, indent=1))
            results.append(summ)
        return results


# --------------------------------------------------------------------------------------------- #
# Phases                                                                                        #
# --------------------------------------------------------------------------------------------- #
def phase_explore(s: Session, args: argparse.Namespace) -> None:
    """Fast-path check, pre-capture cost, graphs-vs-eager run-to-run spread (short Poisson list)."""
    print(json.dumps(check_fast_path("cuda")), flush=True)
    rec = Recorder(use_cuda=True)
    g = EngineSpec("graphs_precaptured", num_blocks=320)
    mgr, info = make_engine(s.model, g, rec, s.smoke)
    probe = w_closed("capacity_probe", 96, 0, 0)
    rng = np.random.default_rng(7)
    p = lognormal_lengths(rng, 96, 512, 0.8, 32, 2048)
    o = lognormal_lengths(rng, 96, 128, 0.6, 16, 512)
    probe = [Req(r.request_id, int(p[i]), int(o[i]), send_s=0.0) for i, r in enumerate(probe)]
    s.capture(mgr, rec, g, info, "capacity_probe_b96", probe, runs=1)
    cap = capacity_rps(s.stage / "capacity_probe_b96" / "run1" / "requests.parquet")
    rate = 0.5 * cap
    print(
        f"[explore] closed-batch capacity {cap:.2f} req/s -> explore rate {rate:.2f} req/s",
        flush=True,
    )
    reqs = w_poisson("explore_poisson", 80, rate, seed=11)
    s.capture(mgr, rec, g, info, "explore_graphs", reqs, runs=2, limit_s=60)
    destroy_engine(mgr)
    print(
        f"[explore] free GPU memory after destroy: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB",
        flush=True,
    )
    e = EngineSpec("eager_async", num_blocks=320, use_cuda_graph=False, precapture_max_seqlen_k=0)
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(s.model, e, rec, s.smoke)
    s.capture(mgr, rec, e, info, "explore_eager", reqs, runs=2, limit_s=60)
    destroy_engine(mgr)


def capacity_rps(path: Path) -> float:
    """Closed-batch capacity: 75 % of the batch over the time the first 75 % took to finish."""
    import pyarrow.parquet as pq

    ends = sorted(e for e in pq.read_table(path).column("end_us").to_pylist() if e is not None)
    k = int(0.75 * len(ends))
    return k / (ends[k - 1] / 1e6)


MAIN_SPEC = EngineSpec("main_precaptured", num_blocks=448)
PRESSURE_BLOCKS = 40


def main_plan(args: argparse.Namespace) -> list[tuple[str, list[Req], dict]]:
    azure = json.loads(args.azure.read_text())
    rows = azure["rows"][: args.azure_num]
    window_rate = (len(rows) - 1) / (rows[-1][0] - rows[0][0])
    stretch = window_rate / args.azure_rate
    plan: list[tuple[str, list[Req], dict]] = [
        (
            "closed_b16",
            w_closed("closed_b16", 16, 1024, 128),
            {"kind": "closed", "batch": 16, "prompt": 1024, "output": 128},
        ),
        (
            "closed_b64",
            w_closed("closed_b64", 64, 512, 128),
            {"kind": "closed", "batch": 64, "prompt": 512, "output": 128},
        ),
        (
            "poisson_r3",
            w_poisson("poisson_r3", 75, 3.0, seed=31),
            {"kind": "poisson", "rate_rps": 3.0, **MIXED},
        ),
        (
            "poisson_r6",
            w_poisson("poisson_r6", 150, 6.0, seed=32),
            {"kind": "poisson", "rate_rps": 6.0, **MIXED},
        ),
        (
            "poisson_r9",
            w_poisson("poisson_r9", 220, 9.0, seed=33),
            {"kind": "poisson", "rate_rps": 9.0, **MIXED},
        ),
        (
            "multiturn",
            w_multiturn("multiturn", 24, 4, 1.5, 1.5, seed=41),
            {
                "kind": "multiturn",
                "sessions": 24,
                "turns": 4,
                "session_rate_rps": 1.5,
                "think_mean_s": 1.5,
                "first_prompt": [384, 768],
                "new_tokens_per_turn": [64, 256],
                "output": [64, 192],
            },
        ),
        (
            "burst_4x",
            w_burst("burst_4x", 2.5, seed=51),
            {
                "kind": "burst",
                "base_rate_rps": 2.5,
                "phases_s_mult": [[10, 1], [5, 4], [10, 1]],
                **MIXED,
            },
        ),
        (
            "azure_conv_sample",
            w_azure("azure_conv_sample", rows, stretch),
            {
                "kind": "trace",
                **azure["meta"],
                "num": len(rows),
                "window_rate_rps": window_rate,
                "time_stretch": stretch,
                "target_rate_rps": args.azure_rate,
            },
        ),
    ]
    print(
        f"[main] capacity {args.capacity_rps} req/s (explore); azure gaps x{stretch:.2f}",
        flush=True,
    )
    return plan


def phase_main(
    s: Session,
    args: argparse.Namespace,
    run_ids: tuple[int, ...] = (1, 2),
    only: list[str] | None = None,
) -> None:
    """Validation workloads below memory pressure, each run twice on one pre-captured engine."""
    skip = set(args.skip.split(","))
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(s.model, MAIN_SPEC, rec, s.smoke)
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    for name in only or list(plan):
        if name in skip:
            continue
        reqs, meta = plan[name]
        s.capture(mgr, rec, MAIN_SPEC, info, name, reqs, limit_s=90, meta=meta, run_ids=run_ids)
    destroy_engine(mgr)


PRESSURE_LEN = dict(
    prompt_median=640,
    prompt_sigma=0.4,
    prompt_lo=256,
    prompt_hi=1024,
    out_median=200,
    out_sigma=0.4,
    out_lo=64,
    out_hi=384,
)


def phase_pressure(s: Session, args: argparse.Namespace) -> None:
    """Small KV cache (requests queue or are preempted), then the cost micro-runs."""
    skip = set(args.skip.split(","))
    reqs = w_poisson("pressure", 48, 3.0, seed=61, lengths=PRESSURE_LEN)
    meta = {"kind": "pressure", "rate_rps": 3.0, "num_blocks": PRESSURE_BLOCKS, **PRESSURE_LEN}
    rec = Recorder(use_cuda=True)
    spec_q = EngineSpec("pressure_queue", num_blocks=PRESSURE_BLOCKS)
    mgr, info = make_engine(s.model, spec_q, rec, s.smoke)
    if "pressure_queue" not in skip:
        s.capture(
            mgr,
            rec,
            spec_q,
            info,
            "pressure_queue",
            rename(reqs, "pressure_queue"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.15},
        )
    if "pressure_soft_reset" not in skip:
        spec_r = EngineSpec("pressure_soft_reset", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
        mgr.batch_processor.scheduler.safety_margin = (
            0.0  # same engine and graphs; only the margin differs
        )
        s.capture(
            mgr,
            rec,
            spec_r,
            info,
            "pressure_soft_reset",
            rename(reqs, "pressure_soft_reset"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.0},
        )
    destroy_engine(mgr)
    if "pressure_cpu_swap" not in skip:
        rec = Recorder(use_cuda=True)
        spec_c = EngineSpec(
            "pressure_cpu_swap",
            num_blocks=PRESSURE_BLOCKS,
            safety_margin=0.0,
            cpu_offload_space_gib=1.0,
        )
        mgr, info = make_engine(s.model, spec_c, rec, s.smoke)
        s.capture(
            mgr,
            rec,
            spec_c,
            info,
            "pressure_cpu_swap",
            rename(reqs, "pressure_cpu_swap"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.0, "cpu_offload_space_gib": 1.0},
        )
        destroy_engine(mgr)
    if "microbench" not in skip:
        microbench(s, args)
    if args.rerun:
        # run 2 of main-phase workloads, on a fresh engine in this process (prefix cache clean)
        phase_main(s, args, run_ids=(2,), only=args.rerun.split(","))


def rename(reqs: list[Req], name: str) -> list[Req]:
    return [
        Req(**{**asdict(r), "request_id": name + r.request_id[r.request_id.index("-") :]})
        for r in reqs
    ]


MICRO_SPEC = EngineSpec("microbench_lazy_graphs", num_blocks=2200, precapture_max_seqlen_k=0)


def microbench_plan() -> list[tuple[dict, list[Req]]]:
    """Closed batches for the per-step cost fit: prefill (batch x prompt, long prompts chunked by
    token budget) and decode (batch x context; the context is one shared prefix, computed once by a
    primer request, so each decode step reads batch x context tokens of KV)."""
    plan = []
    for b in (1, 4, 16):
        for p in (256, 1024, 2048):
            plan.append(
                (
                    {
                        "bench": "prefill",
                        "batch_size": b,
                        "cfg_prompt_tokens": p,
                        "context_tokens": 0,
                    },
                    [Req(f"mb-pf-b{b}-p{p}-{i:03d}", p, 2, send_s=0.0) for i in range(b)],
                )
            )
    for p in (4096, 8192):
        plan.append(
            (
                {
                    "bench": "prefill_chunked",
                    "batch_size": 1,
                    "cfg_prompt_tokens": p,
                    "context_tokens": 0,
                },
                [Req(f"mb-pfc-p{p}-000", p, 2, send_s=0.0)],
            )
        )
    for c in (512, 2048, 4096):
        for b in (1, 8, 32, 64, 128):
            primer = Req(f"mb-dec-b{b}-c{c}-primer", c, 1, send_s=0.0)
            batch = [
                Req(f"mb-dec-b{b}-c{c}-{i:03d}", 15, 32, parent_id=primer.request_id, think_s=0.0)
                for i in range(b)
            ]
            plan.append(
                (
                    {
                        "bench": "decode",
                        "batch_size": b,
                        "cfg_prompt_tokens": 16,
                        "context_tokens": c,
                    },
                    [primer, *batch],
                )
            )
    return plan


def microbench(s: Session, args: argparse.Namespace) -> None:
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(s.model, MICRO_SPEC, rec, s.smoke)
    mgr.start()
    folder = s.stage / "microbench"
    folder.mkdir(parents=True, exist_ok=True)
    all_steps, all_reqs, configs = [], [], []
    for rep in (1, 2):
        for cfg, reqs in microbench_plan():
            reqs = [
                Req(
                    **{
                        **asdict(r),
                        "request_id": f"{r.request_id}-r{rep}",
                        "parent_id": f"{r.parent_id}-r{rep}" if r.parent_id else None,
                    }
                )
                for r in reqs
            ]
            res = run_requests(mgr, rec, reqs, s.seed, s.smoke, limit_s=30)
            resolve_gpu_times(rec)
            tag = {**cfg, "rep": rep, "config_id": len(configs)}
            configs.append(
                {
                    **tag,
                    "wall_s": round(res["wall_s"], 3),
                    "steps": len(rec.steps),
                    "graph_captures": len(rec.captures),
                }
            )
            all_steps += [{**st, **tag} for st in rec.steps]
            all_reqs += [{**r, **tag} for r in res["records"]]
        print(f"[microbench] rep {rep}: {len(configs)} configs, {len(all_steps)} steps", flush=True)
        tag_types = {
            "bench": "string",
            "batch_size": "int32",
            "cfg_prompt_tokens": "int32",
            "context_tokens": "int32",
            "rep": "int32",
            "config_id": "int32",
        }
        write_table(all_steps, {**STEP_TYPES, **tag_types}, folder / "steps")
        write_table(all_reqs, {**REQUEST_TYPES, **tag_types}, folder / "micro_requests")
        eng = engine_config(mgr, MICRO_SPEC, info, s.smoke)
        eng.update(
            configs=configs,
            note="cost micro-runs; rep 1 may capture graphs lazily (graph_captures > 0 "
            "on those steps), rep 2 replays them",
        )
        (folder / "microbench.json").write_text(json.dumps(eng, indent=1, default=str))
        pack(s.stage, s.out, "gt")
    destroy_engine(mgr)


def phase_smoke(s: Session, args: argparse.Namespace) -> None:
    rec = Recorder(use_cuda=False)
    spec = EngineSpec(
        "smoke",
        num_blocks=64,
        block_size=32,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        precapture_max_seqlen_k=0,
    )
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    small = dict(
        prompt_median=64,
        prompt_sigma=0.5,
        prompt_lo=8,
        prompt_hi=200,
        out_median=8,
        out_sigma=0.3,
        out_lo=2,
        out_hi=16,
    )
    s.capture(
        mgr,
        rec,
        spec,
        info,
        "smoke_poisson",
        w_poisson("smoke_poisson", 12, 20.0, 3, small),
        runs=2,
    )
    mt = w_multiturn("smoke_mt", 3, 3, 5.0, 0.05, 5)
    for r in mt:
        r.prompt_tokens = max(4, r.prompt_tokens // 8)
        r.max_new_tokens = 4
    s.capture(mgr, rec, spec, info, "smoke_multiturn", mt, runs=1)
    destroy_engine(mgr)
    rec = Recorder(use_cuda=False)
    spec = EngineSpec(
        "smoke_pressure",
        num_blocks=6,
        block_size=32,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        safety_margin=0.0,
        precapture_max_seqlen_k=0,
    )
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    press = [Req(f"smoke_press-{i}", 40, 30, send_s=0.01 * i) for i in range(8)]
    s.capture(mgr, rec, spec, info, "smoke_pressure", press, runs=1)
    destroy_engine(mgr)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--phase", required=True, choices=["explore", "main", "pressure", "smoke"])
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--explore-rate", type=float, default=6.0)
    ap.add_argument(
        "--capacity-rps", type=float, default=11.7, help="closed-batch capacity measured in explore"
    )
    ap.add_argument(
        "--azure", type=Path, default=Path(__file__).with_name("azure_conv_window.json")
    )
    ap.add_argument("--azure-num", type=int, default=80)
    ap.add_argument(
        "--azure-rate", type=float, default=2.4, help="target mean arrival rate after scaling"
    )
    ap.add_argument("--skip", default="", help="comma-separated workload names to skip")
    ap.add_argument(
        "--rerun", default="", help="pressure phase: main workloads to capture again as run 2"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stage = Path("/tmp/cp_capture") / "gt"
    shutil.rmtree(stage.parent, ignore_errors=True)
    stage.mkdir(parents=True)
    t = perf_counter()
    model = build_model(args.cpu_smoke)
    print(
        f"[model] built in {perf_counter() - t:.1f} s; attn={model.config._attn_implementation}",
        flush=True,
    )
    s = Session(out=args.out, stage=stage, model=model, smoke=args.cpu_smoke)
    if args.phase == "smoke":
        phase_smoke(s, args)
    elif args.phase == "explore":
        phase_explore(s, args)
    else:
        (phase_main if args.phase == "main" else phase_pressure)(s, args)
    print("[done] " + json.dumps(s.summaries), flush=True)


if __name__ == "__main__":
    main()
