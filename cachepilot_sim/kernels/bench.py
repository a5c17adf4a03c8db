"""The whole GPU check-and-time suite in one process: compile every .cu with nvcc (sm_90, ptxas
report), cross-check CUDA and Triton against NumPy, then time swap, fused swap+quantize and quantize
against the baselines, and write `results.json`, `summary.md` and the build log to --out.

    python -m cachepilot_sim.kernels.bench --out "$OUT"
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cachepilot_sim.kernels.cuda import CUDA_SOURCES, KERNEL_DIR
from cachepilot_sim.kernels.layout import KvGeometry
from cachepilot_sim.kernels.timing import Timing

SWAP_SIZES = [4, 8, 16, 64, 256, 1024]
TARGETS = {
    "swap_out_4blk_gbps": 50.0,
    "swap_out_16blk_gbps": 52.0,
    "quantize_gbps": 4000.0,
    "fused_gbps": 95.0,
}


def log(msg: str) -> None:
    print(msg, flush=True)


def nvcc_build(out_dir: Path) -> dict[str, Any]:
    """Compile each .cu to a cubin for sm_90 with the ptxas resource report."""
    report: dict[str, Any] = {}
    lines = []
    for src in CUDA_SOURCES:
        cmd = [
            "nvcc",
            "-arch=sm_90",
            "-Xptxas",
            "-v",
            "-cubin",
            "-o",
            str(out_dir / f"{src}.cubin"),
            str(KERNEL_DIR / src),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            report[src] = {
                "rc": proc.returncode,
                "spills": "spill stores" in proc.stderr and " 0 bytes spill" not in proc.stderr,
            }
            lines.append(f"$ {' '.join(cmd)}\n{proc.stderr}")
        except (OSError, subprocess.SubprocessError) as err:
            report[src] = {"rc": None, "error": repr(err)}
    (out_dir / "nvcc_ptxas.log").write_text("\n".join(lines))
    for src in CUDA_SOURCES:
        (out_dir / f"{src}.cubin").unlink(missing_ok=True)
    return report


def gpu_checks() -> list[dict[str, Any]]:
    from cachepilot_sim.kernels.check import TINY_GEOMETRY, make_backend, run_checks

    llama4 = KvGeometry(num_layers=4, block_size=16, num_kv_heads=8, head_dim=128)
    results = []
    for name in ("cuda", "triton"):
        backend = make_backend(name, "cuda")
        for seed, geom, shape in ((0, TINY_GEOMETRY, (37, 96)), (1, llama4, (300, 2048))):
            for r in run_checks(backend, seed, geom=geom, quant_shape=shape):
                results.append({**asdict(r), "seed": seed})
    results += variant_checks(llama4)
    return results


def variant_checks(llama4: KvGeometry) -> list[dict[str, Any]]:
    """Every non-default swap-in path and per-token kernel the suite times, against NumPy."""
    from cachepilot_sim.kernels import bench_quant
    from cachepilot_sim.kernels.backends import CudaBackend
    from cachepilot_sim.kernels.check import TINY_GEOMETRY, run_variant_checks

    backends = [CudaBackend("cuda", quant_variant=v) for v in bench_quant.TOK_VARIANTS]
    for path in ("swap_in_p4_u2", "swap_in_p1_u8_pf", "swap_in_p4_u2_pf"):
        backends.append(CudaBackend("cuda", swap_in=path))
    for pieces, scatter in ((1, "scatter_p4_u2"), (1, "scatter_p8_u1"), (2, "scatter_p4_u2")):
        backends.append(CudaBackend("cuda", swap_in=f"staged:{pieces}:{scatter}"))
    for path in ("flagged:1", "flagged:2", "flagged:3", "hybrid:1", "hybrid:2"):
        backends.append(CudaBackend("cuda", swap_in=path))
    results = []
    for backend in backends:
        for seed, geom, shape in (
            (10, TINY_GEOMETRY, (37, 96)),
            (11, llama4, (301, 1024)),
            (12, TINY_GEOMETRY, (19, 104)),  # rows of 13 vectors: version 3 falls back to 2
        ):
            for r in run_variant_checks(backend, seed, geom, shape):
                results.append({**asdict(r), "seed": seed})
    return results


def _best(rows: list[Timing], section: str, size: str, prefix: str) -> Timing | None:
    cands = [
        r
        for r in rows
        if r.section == section
        and r.size_label == size
        and r.variant.startswith(prefix)
        and r.reps > 0
    ]
    return min(cands, key=lambda r: r.median_us) if cands else None


def summary(rows: list[Timing], env: dict[str, Any]) -> str:
    """Markdown table: per section and size, the best variant of each family in GB/s."""
    out = [
        f"# GPU kernel benchmark, {env.get('date_utc')}, {env.get('device')}",
        "",
        "| section | size | variant | median us | GB/s |",
        "|---|---|---|---|---|",
    ]
    families = (
        "cuda_",
        "triton_",
        "baseline_plain",
        "baseline_cudaMemcpyBatch",
        "baseline_torch_index",
        "baseline_cudaMemcpyAsync",
        "baseline_torch_eager",
        "baseline_torch_compile",
        "one_copy",
        "hbm",
        "pinned",
    )
    seen = []
    for r in rows:
        key = (r.section, r.size_label)
        if key not in seen:
            seen.append(key)
    for section, size in seen:
        for fam in families:
            b = _best(rows, section, size, fam)
            if b is not None:
                out.append(
                    f"| {section} | {size} | {b.variant} | {b.median_us:.1f} | {b.gbps:.1f} |"
                )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip", nargs="*", default=[], help="sections to skip")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from cachepilot_sim.kernels import timing

    doc: dict[str, Any] = {"environment": timing.environment(), "targets": TARGETS}
    t0 = time.monotonic()

    def save(rows: list[Timing]) -> None:
        doc["timings"] = [r.as_dict() for r in rows]
        doc["elapsed_s"] = round(time.monotonic() - t0, 1)
        (args.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))

    doc["nvcc"] = nvcc_build(args.out)
    log(f"nvcc: {doc['nvcc']}")
    rows: list[Timing] = []
    stages = _stages(rows, doc)
    for name, stage in stages:
        if name in args.skip:
            continue
        try:
            stage()
        except Exception as err:  # keep going: a failed stage is recorded, the rest still runs
            doc.setdefault("errors", {})[name] = str(err)[-2000:]
            log(f"stage {name} FAILED: {str(err)[-2000:]}")
        save(rows)
        log(f"-- {name} done at {time.monotonic() - t0:.0f}s")
    text = summary(rows, doc["environment"])
    (args.out / "summary.md").write_text(text)
    print(text)
    failed = [c for c in doc.get("checks", []) if not c["passed"]]
    log(f"checks: {len(doc.get('checks', [])) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or doc.get("errors") else 0


def _stages(rows: list[Timing], doc: dict[str, Any]) -> list[tuple[str, Any]]:
    from cachepilot_sim.kernels import bench_quant, bench_swap, timing

    state: dict[str, Any] = {}

    def checks() -> None:
        doc["checks"] = gpu_checks()
        for c in doc["checks"]:
            if not c["passed"]:
                log(f"CHECK FAILED {c}")

    def ceilings() -> None:
        rows.append(timing.hbm_copy())
        for mib in (1, 8, 64, 256, 1024):
            for to_host in (True, False):
                rows.append(timing.pinned_copy(mib << 20, to_host))
                log(f"{rows[-1].variant} {rows[-1].size_label} {rows[-1].gbps:.2f} GB/s")

    def swap() -> None:
        state["setup"] = bench_swap.make_setup()
        doc["swap_verify"] = verify_swap(state["setup"])
        log(f"swap verify: {doc['swap_verify']}")
        rows.extend(bench_swap.bench_swap(state["setup"], SWAP_SIZES, log))

    def fused() -> None:
        rows.extend(bench_swap.bench_fused(state["setup"], SWAP_SIZES, log))
        del state["setup"]

    def quant() -> None:
        res, doc["quant_agreement"] = bench_quant.bench_quant(log)
        rows.extend(res)
        log(f"quant agreement: {doc['quant_agreement']}")

    return [
        ("checks", checks),
        ("ceilings", ceilings),
        ("swap", swap),
        ("fused", fused),
        ("quant", quant),
    ]


def verify_swap(s: Any, n: int = 16) -> dict[str, Any]:
    """On the benchmark geometry: CUDA and Triton swap-out equal a torch gather, swap-in restores,
    fused CUDA and Triton codes agree and dequantize within the INT8 bound."""
    import torch

    from cachepilot_sim.kernels import cuda as ck
    from cachepilot_sim.kernels import triton_kernels as tk
    from cachepilot_sim.kernels.formats import HalfFormat
    from cachepilot_sim.kernels.layout import QuantFormat

    g = s.geom
    d = torch.randperm(s.num_device_blocks, device="cuda")[:n]
    h = torch.arange(n, device="cuda")
    want = torch.stack([layer.index_select(1, d).transpose(0, 1) for layer in s.layers], 1)
    elems = n * g.block_bytes // 2
    kv, hp = s.device_kv, s.host_pool.data_ptr()
    res: dict[str, Any] = {}
    for name, run in (
        ("cuda", lambda: ck.swap(kv, ck.BlockPairs(d.data_ptr(), h.data_ptr(), n), hp, True)),
        ("triton", lambda: tk.swap(s.tri_table, g, d, h, hp, True)),
    ):
        s.host_pool[:elems].fill_(7.0)
        run()
        torch.cuda.synchronize()
        res[f"{name}_swap_out_exact"] = bool(
            torch.equal(s.host_pool[:elems].cuda(), want.reshape(-1))
        )
    target = torch.randperm(s.num_device_blocks, device="cuda")[:n]
    for layer in s.layers:
        layer[:, target] = 0.5
    back_in = ck.BlockPairs(target.data_ptr(), h.data_ptr(), n)
    ck.swap(kv, back_in, hp, False)
    back = torch.stack([layer.index_select(1, target).transpose(0, 1) for layer in s.layers], 1)
    res["cuda_swap_in_exact"] = bool(torch.equal(back, want))
    # host ids are 0..n-1: the staging slots too
    job = ck.SwapInJob(back_in, h.tolist(), hp, h.data_ptr(), s.staging.data_ptr())
    paths = {
        "staged_4pieces": lambda: ck.swap_in_staged(kv, job, 4),
        "swap_in_auto": lambda: ck.swap_in(kv, job),
    }
    for pieces in (1, 4, 16):
        paths[f"flagged_{pieces}pieces"] = functools.partial(
            ck.swap_in_staged_flagged, kv, job, -(-n // pieces)
        )
    for k in (4, 8, 12):
        paths[f"hybrid_{k}of{n}"] = functools.partial(ck.swap_in_hybrid, kv, job, k)
    for name in ("swap_in_p4_u2", "swap_in_p1_u8_pf", "swap_in_p4_u2_pf"):
        paths[name] = functools.partial(ck.swap_split, name, kv, back_in, hp)
    for name, run in paths.items():
        for layer in s.layers:
            layer[:, target] = 0.5
        s.staging.fill_(3.0)
        run()
        torch.cuda.synchronize()
        back = torch.stack([layer.index_select(1, target).transpose(0, 1) for layer in s.layers], 1)
        res[f"cuda_{name}_exact"] = bool(torch.equal(back, want))
    codes = []
    for backend in ("cuda", "triton"):
        s.host_codes.fill_(0xA5)
        if backend == "cuda":
            ck.swap_out_quant(
                kv,
                ck.BlockPairs(d.data_ptr(), h.data_ptr(), n),
                ck.QuantPool(s.host_codes.data_ptr(), s.host_scales.data_ptr(), QuantFormat.INT8),
                HalfFormat.BF16,
            )
        else:
            tk.swap_out_quant(
                s.tri_table,
                g,
                d,
                h,
                s.host_codes.data_ptr(),
                s.host_scales.data_ptr(),
                QuantFormat.INT8,
            )
        torch.cuda.synchronize()
        codes.append(s.host_codes[:elems].clone())
    res["fused_int8_cuda_vs_triton_codes_differing"] = int((codes[0] != codes[1]).sum())
    x = want.reshape(-1, g.row_len).float().cpu()
    sc = s.host_scales[: x.shape[0]].clone()
    x_hat = codes[0].view(torch.int8).reshape(x.shape).float() * sc[:, None]
    bound = x.abs().amax(1, keepdim=True) / 254.0
    res["fused_int8_within_bound"] = bool(((x - x_hat).abs() <= bound * (1 + 1e-5)).all())
    return res


if __name__ == "__main__":
    sys.exit(main())
