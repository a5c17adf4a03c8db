"""A micro-profile of one GPU: the hardware rates an engine step cost is made of, measured.

`python -m cachepilot_sim.kernels.profile_gpu --out DIR` (or `python3 path/to/profile_gpu.py`, or
`cachepilot-sim profile-gpu`) on any CUDA host with torch: HBM read and copy rates, bf16 GEMM
time over the token counts an engine step launches (the shapes of the configured model's linear
layers), varlen attention for prefill chunks and for decode batches, kernel launch and CUDA-graph
replay overheads, and pinned host<->device copies. About a minute on an H100 or H200; writes
`gpu_profile.json` (cachepilot_sim.cost.gpu_profile reads it). Imports only torch and the
standard library, so it runs on a bare GPU host without the simulator's dependencies.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

# Token counts of a step's GEMMs (M): decode batches to whole 8192-token prefill budgets.
GEMM_TOKENS = (1, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# Llama-3-8B geometry (the captures' model); --hidden etc. change it.
DEFAULT_MODEL = dict(
    hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256
)


def _timed(torch: Any, fn: Any, reps: int, warmup: int = 3) -> float:
    """Median of `reps` CUDA-event timings of `fn()`, in microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def profile_hbm(torch: Any) -> dict[str, float]:
    """Streaming read (a sum) and device-to-device copy (bytes read + written) of 2 GiB."""
    n = 2**30  # bf16 elements: 2 GiB
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_()
    y = torch.empty_like(x)
    read_us = _timed(torch, lambda: x.sum(dtype=torch.float32), 10)
    copy_us = _timed(torch, lambda: y.copy_(x), 10)
    return {
        "hbm_read_bytes_per_us": 2 * n / read_us,
        "hbm_copy_bytes_per_us": 4 * n / copy_us,
    }


def profile_overheads(torch: Any) -> dict[str, float]:
    """A tiny kernel launched back to back from the host, and per kernel inside a CUDA graph."""
    x = torch.zeros(16, device="cuda")
    num = 200

    def launches() -> None:
        for _ in range(num):
            x.add_(1.0)

    launch_us = _timed(torch, launches, 10) / num
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        launches()  # warm up on the side stream, as graph capture requires
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launches()
    graph_us = _timed(torch, graph.replay, 20) / num
    return {"launch_us": launch_us, "graph_kernel_us": graph_us}


def linear_shapes(m: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(K, N) of each linear layer of one decoder layer, and of the LM head."""
    h, kv = m["hidden"], m["kv_heads"] * m["head_dim"]
    return {
        "qkv": (h, m["heads"] * m["head_dim"] + 2 * kv),
        "o": (m["heads"] * m["head_dim"], h),
        "gate_up": (h, 2 * m["intermediate"]),
        "down": (m["intermediate"], h),
        "lm_head": (h, m["vocab"]),
    }


def profile_gemm(torch: Any, model: dict[str, int], tokens: tuple[int, ...]) -> list[dict]:
    """bf16 x @ W for every (K, N) of the model and every token count M."""
    rows = []
    for name, (k, n) in linear_shapes(model).items():
        w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        for mm in tokens:
            x = torch.randn(mm, k, dtype=torch.bfloat16, device="cuda")
            us = _timed(torch, lambda x=x, w=w: x @ w, 15)
            rows.append({"layer": name, "m": mm, "k": k, "n": n, "us": us})
        del w
    torch.cuda.empty_cache()
    return rows


def _flash(torch: Any, q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int) -> Any:
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=q.shape[-1] ** -0.5
    )


def profile_attention(torch: Any, model: dict[str, int]) -> dict[str, list[dict]]:
    """One layer's varlen causal attention (PyTorch's FlashAttention-2 kernel, GQA, as the
    captures' engine path calls it): prefill of one sequence of L tokens, and decode of
    b sequences of c tokens each (one query token each)."""
    hq, hk, d = model["heads"], model["kv_heads"], model["head_dim"]
    out: dict[str, list[dict]] = {"prefill": [], "decode": []}

    def run(q_lens: list[int], k_lens: list[int]) -> float:
        tq, tk = sum(q_lens), sum(k_lens)
        q = torch.randn(tq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(tk, hk, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(tk, hk, d, dtype=torch.bfloat16, device="cuda")
        cu_q = torch.tensor([0, *_cumsum(q_lens)], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, *_cumsum(k_lens)], dtype=torch.int32, device="cuda")
        return _timed(
            torch,
            lambda: _flash(torch, q, k, v, cu_q, cu_k, max(q_lens), max(k_lens)),
            10,
        )

    for length in (256, 512, 1024, 2048, 4096, 8192):
        out["prefill"].append({"tokens": length, "us": run([length], [length])})
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (512, 2048, 8192):
            if batch * ctx > 2**20:
                continue
            out["decode"].append(
                {"batch": batch, "context": ctx, "us": run([1] * batch, [ctx] * batch)}
            )
    torch.cuda.empty_cache()
    return out


def _cumsum(xs: list[int]) -> list[int]:
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out


def profile_pcie(torch: Any) -> dict[str, float]:
    """Pinned host <-> device copies of 64 MiB, each direction."""
    n = 64 * 2**20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = _timed(torch, lambda: dev.copy_(host, non_blocking=True), 10)
    d2h = _timed(torch, lambda: host.copy_(dev, non_blocking=True), 10)
    return {"pcie_h2d_bytes_per_us": n / h2d, "pcie_d2h_bytes_per_us": n / d2h}


def profile(model: dict[str, int], tokens: tuple[int, ...] = GEMM_TOKENS) -> dict[str, Any]:
    """Every section; returns the profile as a JSON-ready dict."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("profile-gpu: no CUDA device (this tool measures a GPU)")
    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = {
        "format": "cachepilot-gpu-profile/1",
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model,
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    result |= profile_hbm(torch)
    torch.cuda.empty_cache()
    result |= profile_overheads(torch)
    result |= profile_pcie(torch)
    result["gemm"] = profile_gemm(torch, model, tokens)
    result["attention"] = profile_attention(torch, model)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cachepilot-sim profile-gpu", description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_profile.json")
    for key, value in DEFAULT_MODEL.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    args = ap.parse_args(argv)
    model = {key: getattr(args, key) for key in DEFAULT_MODEL}
    if args.out.exists() and not args.out.is_dir():
        raise SystemExit(f"profile-gpu: --out {args.out} is a file, not a folder")
    result = profile(model)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_profile.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    read, copy = result["hbm_read_bytes_per_us"] / 1e3, result["hbm_copy_bytes_per_us"] / 1e3
    print(
        f"[profile-gpu] {result['gpu']}: HBM read {read:.0f} GB/s, copy {copy:.0f} GB/s, "
        f"launch {result['launch_us']:.1f} us, in {result['wall_s']} s -> {path}",
        flush=True,
    )


if __name__ == "__main__":
    main()
