"""Calibrate the simulator's hardware cost parameters on a GPU host.

Measures, on the device this runs on: PCIe transfer time per direction over sizes (the CUDA
zero-copy swap kernel over 1..1024 Llama-3-8B KV blocks, and a plain pinned copy for reference),
per-token quantize bandwidth over sizes, the prefill time of a Llama-3-8B-shaped model with random
bf16 weights over 128..32k tokens and a decode step over batch sizes and contexts; then fits the
cost model (`kernels/fit.py`), prints the error of every point, and writes the raw measurements
(`<date>_h200.json`) and a conf-compatible hardware file (`h200_calibrated.yaml`) to --out.

    python -m cachepilot_sim.tools.calibrate --out experiments/calibration          # on a GPU host
    python -m cachepilot_sim.tools.calibrate --refit experiments/calibration/2026-11-29_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cachepilot_sim.inputs import InputError
from cachepilot_sim.kernels import fit
from cachepilot_sim.outputs import OutputDirError, staged_folder

PREFILL_TOKENS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
# (batch, context): context + 1 (the new token) is a power of two so split-KV decode can divide it
DECODE_CASES = [
    (1, 511),
    (1, 8191),
    (1, 32767),
    (8, 2047),
    (8, 8191),
    (32, 1023),
    (32, 4095),
    (64, 2047),
    (128, 511),
    (128, 2047),
]
SWAP_BLOCKS = [1, 2, 4, 8, 16, 64, 256, 1024]
COPY_BYTES = [1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]
QUANT_ROWS = [1 << 14, 1 << 16, 1 << 18, 1 << 20]


def _timed(fn: Any, reps: int, warmup: int = 2, hide_launch: bool = True) -> dict[str, float]:
    from cachepilot_sim.kernels.timing import time_us

    med, lo, hi = time_us(fn, reps, warmup=warmup, hide_launch=hide_launch)
    return {"median_us": med, "min_us": lo, "max_us": hi, "reps": reps}


def _graph_timed(fn: Any, reps: int) -> dict[str, Any]:
    """Time fn captured in a CUDA graph (as serving engines run decode), so Python's per-kernel
    launch cost (about 20 ms for this model's ~1,000 launches) does not hide the GPU time; falls
    back to eager timing, recorded as such, if capture fails."""
    import torch

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        row = {"mode": "cuda_graph", **_timed(lambda i: graph.replay(), reps)}
        graph.reset()
    except Exception as err:  # capture unsupported here: eager numbers, marked
        row = {"mode": f"eager ({str(err)[-120:]})", **_timed(lambda i: fn(), reps)}
    torch.cuda.empty_cache()
    return row


def measure_model(log: Any) -> dict[str, Any]:
    """Prefill and decode timings of the Llama-3-8B-shaped model, replayed as CUDA graphs."""
    import torch

    from cachepilot_sim.kernels.llama_shape import LlamaShape, LlamaTimingModel

    shape = LlamaShape()
    model = LlamaTimingModel(shape)
    out: dict[str, Any] = {
        "model": {
            "name": "llama3_8b_shape_random_bf16",
            "num_params": shape.num_params,
            "weight_bytes": shape.weight_bytes,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
        },
        "prefill": [],
        "decode": [],
    }
    with torch.inference_mode():
        for n in PREFILL_TOKENS:
            ids = torch.randint(0, shape.vocab, (n,), device="cuda")
            row = {
                "num_tokens": n,
                **_graph_timed(lambda ids=ids: model.prefill(ids), 5 if n < 8192 else 3),
            }
            out["prefill"].append(row)
            log(f"prefill {n:6d} tokens {row['median_us'] / 1e3:9.2f} ms")
        for batch, ctx in DECODE_CASES:
            cache = model.make_kv_cache(batch, ctx)
            ids = torch.randint(0, shape.vocab, (batch,), device="cuda")
            row = {
                "batch_size": batch,
                "context_tokens": ctx,
                **_graph_timed(lambda ids=ids, c=cache: model.decode(ids, c), 7),
            }
            out["decode"].append(row)
            log(f"decode b={batch:4d} ctx={ctx:6d} {row['median_us'] / 1e3:9.2f} ms")
            del cache
            torch.cuda.empty_cache()
    return out


def measure_pcie(log: Any) -> dict[str, list[dict[str, Any]]]:
    """Swap-kernel and plain-copy transfer times per direction: device time, launch hidden (the
    link is busy for the device time; host launch cost depends on the caller, not the link)."""
    import torch

    from cachepilot_sim.kernels import bench_swap
    from cachepilot_sim.kernels import cuda as ck

    out: dict[str, list[dict[str, Any]]] = {"h2d": [], "d2h": []}
    s = bench_swap.make_setup(num_device_blocks=2048, max_blocks=max(SWAP_BLOCKS))
    g, kv, hp = s.geom, s.device_kv, s.host_pool.data_ptr()
    for n in SWAP_BLOCKS:
        sets = bench_swap.id_sets(s, n, seed=n)
        pairs = bench_swap.pairs_of(sets, n)  # addresses into `sets`, which stays referenced
        for direction, to_host in (("d2h", True), ("h2d", False)):

            def fn(i: int, to_host: bool = to_host, pairs: Any = pairs, sets: Any = sets) -> None:
                ck.swap(kv, pairs[i % len(pairs)], hp, to_host, unroll=4)

            row: dict[str, Any] = {
                "path": fit.PCIE_PATH,
                "bytes": n * g.block_bytes,
                "num_blocks": n,
                **_timed(fn, 20 if n <= 64 else 5),
            }
            out[direction].append(row)
            log(
                f"swap {direction} {n:5d} blocks {row['median_us']:10.1f} us "
                f"{row['bytes'] / row['median_us'] / 1e3:6.2f} GB/s"
            )
    for nbytes in COPY_BYTES:
        dev = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        for direction, (dst, src) in (("d2h", (host, dev)), ("h2d", (dev, host))):
            row = {
                "path": "plain_pinned_copy",
                "bytes": nbytes,
                **_timed(
                    lambda i, d=dst, s=src: d.copy_(s, non_blocking=True),
                    20 if nbytes <= 1 << 26 else 5,
                ),
            }
            out[direction].append(row)
    return out


def measure_quant(log: Any) -> list[dict[str, Any]]:
    """Per-token INT8 quantize of [rows, 1024] bf16 over sizes, CUDA and Triton (launch hidden)."""
    import torch

    from cachepilot_sim.kernels import cuda as ck
    from cachepilot_sim.kernels import triton_kernels as tk
    from cachepilot_sim.kernels.formats import HalfFormat
    from cachepilot_sim.kernels.layout import QuantFormat

    out = []
    for rows in QUANT_ROWS:
        x = torch.randn(rows, 1024, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(rows, 1024, dtype=torch.uint8, device="cuda")
        sc = torch.empty(rows, dtype=torch.float32, device="cuda")
        mats = ck.QuantRows(
            x.data_ptr(), q.data_ptr(), sc.data_ptr(), rows, 1024, HalfFormat.BF16, QuantFormat.INT8
        )
        variants = {
            fit.QUANT_VARIANT: lambda i, x=x, q=q, sc=sc: tk.quantize_per_token(
                x, QuantFormat.INT8, q, sc, 4, 4
            ),
            "cuda_tok_int8_t256_r1": lambda i, m=mats: ck.quantize_per_token(m),
        }
        for name, fn in variants.items():
            row: dict[str, Any] = {
                "variant": name,
                "num_rows": rows,
                "row_len": 1024,
                "bytes": rows * 1024 * 3 + rows * 4,
                **_timed(fn, 20, hide_launch=True),
            }
            out.append(row)
            log(f"quant {name} rows={rows} {row['bytes'] / row['median_us'] / 1e3:8.1f} GB/s")
    return out


def measure_transformers_prefill(
    log: Any, tokens: tuple[int, ...] = (2048, 8192, 32768)
) -> list[dict[str, Any]]:
    """Cross-check only (not fitted): the same shape through transformers' LlamaForCausalLM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=32768,
        rope_theta=500000.0,
        attn_implementation="sdpa",
    )
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    out = []
    with torch.inference_mode():
        for n in tokens:
            ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
            row = {
                "num_tokens": n,
                **_timed(lambda i, ids=ids: model(ids, use_cache=False, logits_to_keep=1), 3),
            }
            out.append(row)
            log(f"transformers prefill {n:6d} tokens {row['median_us'] / 1e3:9.2f} ms")
    return out


def report(params: dict[str, Any], errors: dict[str, list[fit.PointError]], log: Any) -> None:
    for name, errs in errors.items():
        for e in errs:
            log(
                f"{name:10s} {e.label:24s} measured {e.measured_us:12.1f} us  "
                f"fit {e.predicted_us:12.1f} us  error {100 * e.rel_error:+6.2f} %"
            )
    for key, value in fit.error_summary(errors).items():
        log(
            f"{key:10s} median |error| {100 * value['median_abs_rel']:.2f} %  "
            f"max {100 * value['max_abs_rel']:.2f} %"
        )
    for key in fit.HARDWARE_KEYS:
        log(f"{key}: {params[key]}")


def write_outputs(raw: dict[str, Any], out_dir: Path, log: Any, write_raw: bool = True) -> None:
    """Fit, print every point's error, write raw JSON, fit errors JSON and the hardware YAML:
    together, through a staging folder (outputs.staged_folder), so an earlier calibration in
    `out_dir` is replaced only by a whole new one."""
    params, errors = fit.fit_all(raw)
    report(params, errors, log)
    summary = fit.error_summary(errors)
    errs = {
        k: [
            {
                "label": e.label,
                "measured_us": e.measured_us,
                "predicted_us": e.predicted_us,
                "rel_error": e.rel_error,
            }
            for e in v
        ]
        for k, v in errors.items()
    }
    comment = (
        f"Fitted by `python -m cachepilot_sim.tools.calibrate` from {params['source']}.\n"
        f"Fit error over all points: median {100 * summary['all']['median_abs_rel']:.1f} %,"
        f" max {100 * summary['all']['max_abs_rel']:.1f} %; per point in "
        f"{raw['date']}_h200_fit.json."
    )
    texts = {
        f"{raw['date']}_h200_fit.json": json.dumps(
            {"parameters": params, "summary": summary, "points": errs}, indent=1
        ),
        "h200_calibrated.yaml": fit.hardware_yaml(params, comment),
    }
    if write_raw:
        texts[f"{raw['date']}_h200.json"] = json.dumps(raw, indent=1)
    with staged_folder(out_dir) as stage:
        for name, text in texts.items():
            (stage / name).write_text(text)


def measure_all(log: Any) -> dict[str, Any]:
    from cachepilot_sim.kernels.timing import environment, hbm_copy

    env = environment()
    raw: dict[str, Any] = {"date": env["date_utc"][:10], "environment": env}
    raw["hbm_copy"] = hbm_copy().as_dict()
    raw["quantize"] = measure_quant(log)
    raw["pcie"] = measure_pcie(log)
    raw.update(measure_model(log))
    try:
        raw["transformers_prefill_crosscheck"] = measure_transformers_prefill(log)
    except Exception as err:  # transformers missing or incompatible: recorded, not fatal
        raw["transformers_prefill_crosscheck"] = f"unavailable: {str(err)[-300:]}"
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("experiments/calibration"))
    parser.add_argument("--refit", type=Path, help="fit an existing raw file instead (no GPU)")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        if args.refit:
            raw = _read_raw(args.refit)
            try:  # the fit runs before anything is written
                write_outputs(raw, args.out, log, write_raw=False)
            except OutputDirError:
                raise
            except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
                raise CalibrationError(
                    f"{args.refit}: not a raw calibration file measure_all wrote "
                    f"({type(err).__name__}: {err})"
                ) from err
            return 0
        _require_gpu()
        raw = measure_all(log)
        write_outputs(raw, args.out, log)
    except (CalibrationError, OutputDirError) as err:
        print(f"calibrate: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an unwritable --out: named, no traceback
        print(f"calibrate: {err.filename}: cannot write ({err.strerror})", file=sys.stderr)
        return 2
    return 0


class CalibrationError(InputError):
    """A calibration that cannot run or a raw file that cannot be fitted; names the cause."""


def _require_gpu() -> None:
    try:
        import torch

        found = bool(torch.cuda.is_available())
    except ImportError:
        found = False
    if not found:
        raise CalibrationError(
            "measuring needs a CUDA GPU (none found here); to fit an existing raw file on CPU: "
            "--refit experiments/calibration/<date>_<gpu>.json"
        )


def _read_raw(path: Path) -> dict[str, Any]:
    """A raw calibration file as measure_all wrote it; refused with its name otherwise."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CalibrationError(f"{path}: cannot read a raw calibration file ({err})") from err
    if not isinstance(raw, dict):
        raise CalibrationError(f"{path}: not a raw calibration file (expected a JSON object)")
    return raw


if __name__ == "__main__":
    sys.exit(main())
