"""Hardware scorecard: decode roofline and KV capacity of one model on every GPU tier.

    cachepilot-sim scorecard [--model llama3_8b] [--context-tokens 2048] [--batch 0]
        [--activation-reserve-gb 1.073741824] [--gpus a100_40gb,h200,...]

Datasheet figures come from conf/gpu/*.yaml (each one cites its source), the model from
conf/model/<model>.yaml. For each tier: the decode step's bandwidth bound (weights + KV of the
batch over HBM bandwidth) and compute bound (FLOPs over the dense peak), which one binds, the
decode ceiling in tokens/s, and how many context tokens of KV fit in FP16, FP8 and INT8 after the
pinned weights and the activation reserve. `--batch 0` takes the largest batch of `context_tokens`
sequences whose FP16 KV fits. Where a tier names a calibrated conf/hardware file, its measured
figures are printed beside the datasheet's. Derivation: docs/roofline.md. Exit status 2 on a bad
argument, naming the key.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cachepilot_sim.config import (
    GB,
    ConfigError,
    GpuSpecConfig,
    HardwareConfig,
    KVConfig,
    ModelConfig,
    require,
)
from cachepilot_sim.config.store import load_profile
from cachepilot_sim.cost.kv_bytes import KvDtype, kv_bytes_per_token
from cachepilot_sim.cost.model import compute_fit, iteration_us
from cachepilot_sim.cost.roofline import (
    DecodeBound,
    capacity_tokens,
    decode_bound,
    kv_pool_bytes,
    pcie_gbps,
    ridge_batch,
)
from cachepilot_sim.entry import entry_point
from cachepilot_sim.tools import CONF_DIR

MAX_TOKENS = 2**31 - 1

DEFAULTS = {
    "model": "llama3_8b",
    "context_tokens": "2048",
    "batch": "0",
    "activation_reserve_gb": str(KVConfig().activation_reserve_bytes / GB),
    "gpus": "",
}


def _load(cls: type, path: Path) -> Any:
    """A profile file over its schema: it states every required key (config/store.REQUIRED_KEYS),
    no default stands in; an error names the file and key."""
    section = {ModelConfig: "model", GpuSpecConfig: "gpu", HardwareConfig: "hardware"}[cls]
    return load_profile(section, path)


def known(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def load_model(name: str) -> ModelConfig:
    require(name in known("model"), "model", name, f"unknown model; known: {known('model')}")
    model: ModelConfig = _load(ModelConfig, CONF_DIR / "model" / f"{name}.yaml")
    return model


def load_gpus(names: list[str] | None = None) -> list[GpuSpecConfig]:
    """Every tier in conf/gpu (or the named ones), ordered by HBM bandwidth."""
    for name in names or []:
        require(name in known("gpu"), "gpus", name, f"unknown GPU tier; known: {known('gpu')}")
    gpus = [_load(GpuSpecConfig, CONF_DIR / "gpu" / f"{n}.yaml") for n in names or known("gpu")]
    return sorted(gpus, key=lambda g: (g.hbm_gbps, g.name))


def load_hardware(name: str) -> HardwareConfig:
    hw: HardwareConfig = _load(HardwareConfig, CONF_DIR / "hardware" / f"{name}.yaml")
    return hw


@dataclass(frozen=True, slots=True)
class TierScore:
    """One row of the scorecard."""

    gpu: GpuSpecConfig
    pool_bytes: int
    tokens: dict[KvDtype, int]
    bound: DecodeBound | None  # None: the weights alone do not fit
    ridge: float


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The command line (argparse: `--model NAME --context-tokens N ...`), validated."""
    ap = argparse.ArgumentParser(
        prog="cachepilot-sim scorecard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", default=DEFAULTS["model"], help="cachepilot_sim/conf/model/<name>")
    ap.add_argument(
        "--context-tokens",
        dest="context_tokens",
        default=DEFAULTS["context_tokens"],
        help="context tokens per sequence",
    )
    ap.add_argument("--batch", default=DEFAULTS["batch"], help="0: largest that fits")
    ap.add_argument(
        "--activation-reserve-gb",
        dest="activation_reserve_gb",
        default=DEFAULTS["activation_reserve_gb"],
        help="GB kept for activations",
    )
    ap.add_argument("--gpus", default=DEFAULTS["gpus"], help="comma-separated tiers (default: all)")
    values = {k: str(v) for k, v in vars(ap.parse_args(argv)).items()}
    out: dict[str, Any] = {"model": values["model"]}
    for key in ("context_tokens", "batch"):
        try:
            out[key] = int(values[key])
        except ValueError:
            raise ConfigError(f"config key '{key}' = {values[key]!r}: must be an integer") from None
    ctx, batch = out["context_tokens"], out["batch"]
    require(0 < ctx <= MAX_TOKENS, "context_tokens", ctx, f"must be in 1..{MAX_TOKENS}")
    require(0 <= batch <= MAX_TOKENS, "batch", batch, "must be >= 0 (0: largest that fits)")
    try:
        reserve_gb = float(values["activation_reserve_gb"])
    except ValueError:
        reserve_gb = -1.0
    require(
        0 <= reserve_gb <= 1e5,  # NaN and infinity refused
        "activation_reserve_gb",
        values["activation_reserve_gb"],
        "must be a number in [0, 1e5] GB",
    )
    out["reserve_bytes"] = int(reserve_gb * GB)
    out["gpus"] = [g for g in values["gpus"].split(",") if g]
    return out


def score(
    gpu: GpuSpecConfig, model: ModelConfig, context_tokens: int, batch: int, reserve_bytes: int
) -> TierScore:
    """The roofline and capacity figures of one tier (batch 0: the largest FP16 batch that fits)."""
    pool = kv_pool_bytes(gpu, model, reserve_bytes)
    tokens = {
        d: capacity_tokens(pool, kv_bytes_per_token(model, d.value_bytes, d.scale_bytes))
        for d in KvDtype
    }
    fp16 = kv_bytes_per_token(model, KvDtype.FP16.value_bytes)
    num_seqs = batch or max(1, tokens[KvDtype.FP16] // context_tokens)
    # No bound for a batch whose KV does not fit beside the weights: it cannot run on this tier.
    fits = gpu.hbm_bytes >= model.weight_bytes + reserve_bytes
    fits = fits and num_seqs * context_tokens <= tokens[KvDtype.FP16]
    bound = decode_bound(gpu, model, num_seqs, context_tokens, fp16) if fits else None
    return TierScore(gpu, pool, tokens, bound, ridge_batch(gpu, model, context_tokens, fp16))


def measured_rows(
    ts: TierScore, model: ModelConfig, context_tokens: int
) -> list[tuple[str, str, str]]:
    """Datasheet vs the calibrated hardware file's figures: (quantity, datasheet, measured)."""
    gpu = ts.gpu
    hw = load_hardware(gpu.calibrated_hardware)
    rows = [
        (
            "HBM GB/s (effective, decode fit)",
            f"{gpu.hbm_gbps:,.0f}",
            f"{hw.hbm_bytes_per_us / 1e3:,.0f}",
        )
    ]
    if gpu.calibration_num_params:
        tflops = 2.0 * gpu.calibration_num_params / hw.prefill_token_us / 1e6
        rows.append(
            ("dense BF16 TFLOP/s (prefill fit)", f"{gpu.bf16_dense_tflops:,.1f}", f"{tflops:,.1f}")
        )
    link = pcie_gbps(gpu)
    rows.append(("PCIe h2d GB/s", f"{link:.1f}", f"{hw.pcie_h2d_bytes_per_us / 1e3:.1f}"))
    rows.append(("PCIe d2h GB/s", f"{link:.1f}", f"{hw.pcie_d2h_bytes_per_us / 1e3:.1f}"))
    rows.append(("quantize GB/s (r+w)", "-", f"{hw.quantize_bytes_per_us / 1e3:,.0f}"))
    if ts.bound is not None:
        b = ts.bound
        fp16 = kv_bytes_per_token(model, KvDtype.FP16.value_bytes)
        sim_us = iteration_us(
            compute_fit(hw),
            model.weight_bytes,
            b.batch,
            b.batch * context_tokens * fp16,
            b.batch * (context_tokens + 0.5),
        )
        rows.append(
            (
                f"decode step ms, batch {b.batch}",
                f"{b.step_us / 1e3:.2f} (roofline)",
                f"{sim_us / 1e3:.2f} (cost model)",
            )
        )
    return rows


def render(
    scores: list[TierScore],
    model: ModelConfig,
    context_tokens: int,
    console: Console,
    reserve_bytes: int,
) -> None:
    sheet = Table(title="Datasheet figures (conf/gpu/*.yaml; dense tensor-core rates)")
    for col in ("GPU", "HBM GB", "HBM GB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "PCIe (GB/s/dir)"):
        sheet.add_column(col, justify="left" if col == "GPU" else "right")
    for ts in scores:
        g = ts.gpu
        sheet.add_row(
            g.display_name,
            f"{g.hbm_gb:.0f}",
            f"{g.hbm_gbps:,.0f}",
            f"{g.bf16_dense_tflops:,.1f}",
            f"{g.fp8_dense_tflops:,.1f}" if g.fp8_dense_tflops else "-",
            f"Gen{g.pcie_gen} x{g.pcie_lanes} ({pcie_gbps(g):.1f})",
        )
    console.print(sheet)

    fp16 = kv_bytes_per_token(model, KvDtype.FP16.value_bytes)
    roof = Table(
        title=f"Decode roofline: {model.name}, {context_tokens} context tokens a "
        f"sequence, FP16 KV ({fp16 / 1024:.0f} KiB/token)"
    )
    for col in (
        "GPU",
        "batch",
        "bytes/step GB",
        "bandwidth ms",
        "compute ms",
        "binds",
        "ceiling tok/s",
        "ridge batch",
    ):
        roof.add_column(col, justify="left" if col in ("GPU", "binds") else "right")
    for ts in scores:
        b = ts.bound
        ridge = "never" if ts.ridge == float("inf") else f"{ts.ridge:,.0f}"
        if b is None:
            why = "weights do not fit" if ts.pool_bytes <= 0 else "batch KV does not fit"
            roof.add_row(ts.gpu.display_name, "-", "-", "-", "-", why, "-", "-")
            continue
        roof.add_row(
            ts.gpu.display_name,
            str(b.batch),
            f"{b.step_bytes / GB:.2f}",
            f"{b.bandwidth_us / 1e3:.2f}",
            f"{b.compute_us / 1e3:.2f}",
            b.binding,
            f"{b.tokens_per_s:,.0f}",
            ridge,
        )
    console.print(roof)

    cap = Table(
        title=f"KV capacity after {model.weight_bytes / GB:.2f} GB of weights and "
        f"{reserve_bytes / GB:.2f} GB activation reserve (context tokens, all "
        f"sequences)"
    )
    for col in (
        "GPU",
        "KV pool GB",
        "FP16 tokens",
        "FP8 tokens",
        "INT8 tokens",
        f"seqs of {context_tokens} (FP16)",
    ):
        cap.add_column(col, justify="left" if col == "GPU" else "right")
    for ts in scores:
        t = ts.tokens
        cap.add_row(
            ts.gpu.display_name,
            f"{ts.pool_bytes / GB:.2f}",
            f"{t[KvDtype.FP16]:,}",
            f"{t[KvDtype.FP8]:,}",
            f"{t[KvDtype.INT8]:,}",
            f"{t[KvDtype.FP16] // context_tokens:,}",
        )
    console.print(cap)

    for ts in scores:
        if not ts.gpu.calibrated_hardware:
            continue
        meas = Table(
            title=f"{ts.gpu.display_name}: datasheet vs measured "
            f"(conf/hardware/{ts.gpu.calibrated_hardware}.yaml)"
        )
        for col in ("quantity", "datasheet", "measured"):
            meas.add_column(col, justify="left" if col == "quantity" else "right")
        for row in measured_rows(ts, model, context_tokens):
            meas.add_row(*row)
        console.print(meas)


@entry_point("scorecard")
def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    model = load_model(a["model"])
    gpus = load_gpus(a["gpus"])
    scores = [score(g, model, a["context_tokens"], a["batch"], a["reserve_bytes"]) for g in gpus]
    # markup=False: GPU and model names from YAML are printed as written, brackets included.
    console = Console(width=140, markup=False)
    render(scores, model, a["context_tokens"], console, a["reserve_bytes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
