"""What the KV tier does on mixed_spike: bf16 KV, FP8 KV on the GPU, an INT8 CPU tier (not a test).

Every variant runs PERC on the same seeds; realized restore is what the run paid (reloads, with
their dequantization for the INT8 tier, plus recomputes), convert is the GPU time spent quantizing
and dequantizing for the CPU tier (hardware.quantize_bytes_per_us, the calibrated Triton kernel).

    python experiments/kv_tier.py [--seeds 5] [--out experiments/kv_tier.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.runner import run_cells

CONF = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
VARIANTS = {
    "bf16 KV (default)": [],
    "FP8 KV on the GPU": ["model.kv_dtype_bytes=1"],
    "bf16 GPU, INT8 CPU tier": ["kv.offload_dtype_bytes=1"],
    "bf16 KV, no offload": ["kv.offload_enabled=false"],
    "FP8 KV on the GPU, no offload": ["model.kv_dtype_bytes=1", "kv.offload_enabled=false"],
}
COLUMNS = (
    ("kv_pool_gb", "KV pool GB", "{:.2f}"),
    ("evictions", "evictions", "{:.0f}"),
    ("reloads", "reloads", "{:.0f}"),
    ("recomputes", "recomputes", "{:.0f}"),
    ("pcie_d2h_gb", "offloaded GB", "{:.1f}"),
    ("realized_reload_s", "reload s", "{:.2f}"),
    ("realized_restore_s", "restore s", "{:.2f}"),
    ("kv_convert_s", "convert s", "{:.3f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("goodput_req_s", "goodput req/s", "{:.3f}"),
)


def cells(overrides: list[str], seeds: int) -> list[dict[str, float]]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_config(
            compose(
                "config",
                overrides=[
                    "+experiment=mixed_spike",
                    "trace.enabled=false",
                    "write_requests=false",
                    "compare_policies=[perc]",
                    f"seeds={seeds}",
                    "jobs=2",
                    *overrides,
                ],
            )
        )
    return run_cells(cfg, None)


def fmt(values: list[float], spec: str) -> str:
    v = np.array(values, dtype=float)
    sd = v.std(ddof=1) if v.size > 1 else 0.0
    return f"{spec.format(v.mean())} ± {spec.format(sd)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    register_configs()
    rows = [
        "| variant | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, overrides in VARIANTS.items():
        run = cells(overrides, args.seeds)
        rows.append(
            f"| {name} | "
            + " | ".join(fmt([c[key] for c in run], spec) for key, _, spec in COLUMNS)
            + " |"
        )
        print(rows[-1], flush=True)
    head = (
        f"# KV tier on mixed_spike (PERC, seeds 0-{args.seeds - 1}, calibrated H200)\n\n"
        f"Command: `python experiments/kv_tier.py --seeds {args.seeds} "
        "--out experiments/kv_tier.md`; mean ± σ (sample) over seeds.\n\n"
    )
    text = head + "\n".join(rows) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
