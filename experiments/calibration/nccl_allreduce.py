"""Measure the all-reduces a tensor-parallel step sends, and fit the ring model's link figures.

Issue 17, item 4. `cost/gpu_scaling.py` prices tensor parallelism with two ring all-reduces per
layer of each token's hidden state (BF16), alpha-beta: NCCL's ring latency (base + 2(p-1) hops)
+ 2(p-1)/p x bytes / link bandwidth, with datasheet figures (`conf/gpu/*.yaml`: interconnect_gbps,
interconnect_hop_latency_us). This script replaces the guess by a measurement where a machine
with several GPUs is lent.

    # on a machine with P GPUs (no hydra/simpy needed: torch only); one process per GPU
    python3 experiments/calibration/nccl_allreduce.py measure --world 2 4 8 --out nccl.json
    # here: fit alpha + beta x bytes per world size, the implied link figures, and the
    # simulator's per-step all-reduce time (derived vs measured) for a model
    python experiments/calibration/nccl_allreduce.py fit nccl.json --model llama3_8b

`measure` runs every world size in turn (`torch.multiprocessing.spawn`, a TCP rendezvous on
localhost), times `dist.all_reduce` of BF16 tensors of `tokens x hidden` values for the token
counts a step computes (1 to 8,192: decode batches to a full prefill chunk), with CUDA events
around `--iters` back-to-back calls after `--warmup`, and checks each result (the sum of the
ranks' values). `--backend gloo --device cpu` runs the same code on a CPU (tests, smoke runs:
float32, as gloo's sum is defined for it; the figures are then the CPU's, not a GPU link's).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the lending machines require it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# The machines that lend several GPUs require NVLink multicast off in every program (KINDS.md).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
HIDDEN = 4096  # Llama-3-8B's hidden size (num_attention_heads x head_dim)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    """One rank: time every size, rank 0 puts its rows in `out` (a manager list)."""
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=torch.device(f"cuda:{rank}") if cuda else None,
    )
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    for tokens in args.tokens:
        numel = tokens * args.hidden
        x = torch.full((numel,), float(rank + 1), dtype=dtype, device=dev)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        x.fill_(float(rank + 1))
        dist.all_reduce(x)  # checked: every value is 1 + 2 + ... + world
        want = world * (world + 1) / 2
        ok = bool(torch.all(x == want).item())
        times_us = []
        for _ in range(args.repeats):
            dist.barrier()
            if cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(args.iters):
                    dist.all_reduce(x)
                end.record()
                torch.cuda.synchronize()
                times_us.append(1e3 * start.elapsed_time(end) / args.iters)
            else:
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    dist.all_reduce(x)
                times_us.append(1e6 * (time.perf_counter() - t0) / args.iters)
        rows.append(
            {
                "world": world,
                "tokens": tokens,
                "bytes": numel * x.element_size(),
                "us_median": statistics.median(times_us),
                "us_min": min(times_us),
                "us_all": times_us,
                "sum_ok": ok,
            }
        )
    if rank == 0:
        out.extend(rows)
    dist.barrier()
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every world size in turn; the rows of rank 0, with what the machine is."""
    import torch
    import torch.multiprocessing as mp

    have = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count() or 1
    worlds = [w for w in args.world if w <= have]
    skipped = [w for w in args.world if w > have]
    rows: list[dict[str, Any]] = []
    with mp.Manager() as manager:
        for world in worlds:
            shared = manager.list()
            mp.spawn(_worker, args=(world, _free_port(), args, shared), nprocs=world, join=True)
            rows.extend(shared)
    info: dict[str, Any] = {
        "backend": args.backend,
        "device": args.device,
        "torch": torch.__version__,
        "hidden": args.hidden,
        "iters": args.iters,
        "repeats": args.repeats,
        "skipped_worlds": skipped,
        "rows": rows,
    }
    if args.device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def fit_world(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Least-squares alpha (µs) + beta (µs per byte) over one world size's medians."""
    import numpy as np

    x = np.array([r["bytes"] for r in rows], dtype=float)
    y = np.array([r["us_median"] for r in rows], dtype=float)
    beta, alpha = np.polyfit(x, y, 1)
    return float(alpha), float(beta)


def implied_link(world: int, alpha_us: float, beta_us_per_byte: float) -> dict[str, float]:
    """The ring model's link figures that give this alpha and beta (gpu_scaling's form):
    alpha = base + 2(p-1) x hop; beta = 2(p-1)/p / (GB/s x 1e3)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cachepilot_sim.cost.gpu_scaling import RING_BASE_LATENCY_US

    hop = (alpha_us - RING_BASE_LATENCY_US) / (2 * (world - 1))
    gbps = 2.0 * (world - 1) / world / (beta_us_per_byte * 1e3) if beta_us_per_byte > 0 else 0.0
    return {"hop_latency_us": hop, "link_gbps": gbps}


def fit(path: Path, model_name: str, gpu_name: str) -> dict[str, Any]:
    """Per world size: alpha, beta, the implied link figures, and one step's all-reduce time
    (2 per layer) measured vs derived from the GPU file, at the measured token counts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from omegaconf import OmegaConf

    from cachepilot_sim.config import GpuSpecConfig, ModelConfig
    from cachepilot_sim.cost.gpu_scaling import ALLREDUCES_PER_LAYER, allreduce_fit
    from cachepilot_sim.tools import CONF_DIR

    data = json.loads(path.read_text())
    model = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig), OmegaConf.load(CONF_DIR / f"model/{model_name}.yaml")
        )
    )
    gpu = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(GpuSpecConfig), OmegaConf.load(CONF_DIR / f"gpu/{gpu_name}.yaml")
        )
    )
    assert isinstance(model, ModelConfig) and isinstance(gpu, GpuSpecConfig)
    per_layer = ALLREDUCES_PER_LAYER * model.num_layers
    out: dict[str, Any] = {"source": str(path), "model": model_name, "gpu": gpu_name, "worlds": {}}
    for world in sorted({r["world"] for r in data["rows"]}):
        rows = sorted((r for r in data["rows"] if r["world"] == world), key=lambda r: r["bytes"])
        alpha, beta = fit_world(rows)
        derived = allreduce_fit(model, gpu, world)
        steps = []
        for r in rows:
            measured_step = per_layer * r["us_median"]
            derived_step = derived.step_us + derived.token_us * r["tokens"]
            steps.append(
                {
                    "tokens": r["tokens"],
                    "measured_step_us": measured_step,
                    "derived_step_us": derived_step,
                    "derived_over_measured": derived_step / measured_step,
                }
            )
        out["worlds"][str(world)] = {
            "alpha_us": alpha,
            "beta_us_per_byte": beta,
            "implied": implied_link(world, alpha, beta),
            "datasheet": {
                "hop_latency_us": gpu.interconnect_hop_latency_us,
                "link_gbps": gpu.interconnect_gbps,
            },
            "all_sums_ok": all(r["sum_ok"] for r in rows),
            "step": steps,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time all-reduces (torch only)")
    m.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    m.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    m.add_argument("--hidden", type=int, default=HIDDEN)
    m.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    m.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    m.add_argument("--warmup", type=int, default=20)
    m.add_argument("--iters", type=int, default=50)
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("fit", help="fit and compare with the ring model (needs the package)")
    f.add_argument("measurements", type=Path)
    f.add_argument("--model", default="llama3_8b")
    f.add_argument("--gpu", default="h200")
    f.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "measure":
        if a.backend == "nccl" and a.device != "cuda":
            p.error("--backend nccl needs --device cuda")
        result = measure(a)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))
        print(f"{len(result['rows'])} rows -> {a.out}; skipped worlds {result['skipped_worlds']}")
    else:
        if not a.measurements.is_file():
            p.error(f"no such file: {a.measurements}")
        result = fit(a.measurements, a.model, a.gpu)
        text = json.dumps(result, indent=1)
        if a.out:
            a.out.write_text(text)
        print(text)


if __name__ == "__main__":
    main()
