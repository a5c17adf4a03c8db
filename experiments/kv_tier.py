"""What the KV tier does on mixed_spike: bf16 KV, FP8 KV on the GPU, an INT8 CPU tier (not a test).

Every variant runs PERC on the same seeds; realized restore is what the run paid (reloads, with
their dequantization for the INT8 tier, plus recomputes), convert is the GPU time spent quantizing
and dequantizing for the CPU tier (hardware.quantize_bytes_per_us, the calibrated Triton kernel).

    python experiments/kv_tier.py [--seeds 5] [--out experiments/kv_tier.md]

`--part shared` instead runs the cluster's shared KV tier's choices (cluster/shared_tier.py): write
on completion vs on eviction, load always vs when cheaper, on the Mooncake synthetic trace at 4
replicas over RDMA and TCP, and replaces that section of `--out`, keeping the rest.

    python experiments/kv_tier.py --part shared [--limit 1200] [--out experiments/kv_tier.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


SHARED_HEAD = "## Shared KV tier: when to write, whether to load"
TRACES = os.environ.get("CACHEPILOT_TRACES_DIR", "../shared/traces")
MOONCAKE = f"{TRACES}/mooncake_synthetic/synthetic_trace.jsonl"
# (link name, overrides): the store's fabric; "TCP 25 GbE" shows where loading stops paying.
LINKS = {
    "RDMA 50 GB/s": ["cluster.shared_tier.link=RDMA"],
    "TCP 12.5 GB/s": ["cluster.shared_tier.link=TCP"],
    "TCP 3.1 GB/s": ["cluster.shared_tier.link=TCP", "cluster.tcp_gb_per_s=3.125"],
}
CHOICES = [(w, ld) for w in ("ON_COMPLETION", "ON_EVICTION") for ld in ("ALWAYS", "CHEAPER")]


def shared_run(overrides: list[str]) -> dict[str, Any]:
    """One cluster run (one seed: replay is deterministic) with its prefill tokens computed."""
    from cachepilot_sim.sim import make_simulation

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_config(compose("config", overrides=[*overrides, "trace.enabled=false"]))
    sim = make_simulation(cfg.sim_for(cfg.policy.name, cfg.seed))
    m = sim.run().metrics
    return m | {"prefill_tokens": sum(r.prefill_tokens for r in sim.clients.requests)}


def shared_row(link: str, write: str, load: str, m: dict[str, Any]) -> str:
    """Restore paid = CPU reloads + recomputes of blocks a replica had cached + the tier's
    loads + the recompute CHEAPER chose over a load."""
    restore = m["realized_restore_s"] + m["shared_restore_s"]
    return (
        f"| {link} | {write.lower()} | {load.lower()} | {m['shared_hit_ratio']:.3f} "
        f"| {m['shared_write_gb']:.0f} | {m['shared_load_s']:.1f} | {m['shared_recompute_s']:.1f} "
        f"| {restore:.1f} | {m['prefill_tokens'] / 1e6:.2f} | {m['ttft_p50_s']:.2f} "
        f"| {m['ttft_p99_s']:.2f} | {m['goodput_req_s']:.2f} |"
    )


def shared_section(limit: int, out: Path | None) -> None:
    """Every link x write x load on the first `limit` Mooncake requests, 4 replicas, round
    robin (the router that leaves the tier the most to serve), 1000 GB LRU store, LRU GPUs."""
    load_start = os.getloadavg()[0]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = [
        "| link | write | load | hit ratio from the tier | tier written GB | tier load s "
        "| tier recompute s | restore paid s | prefill Mtok | TTFT p50 (s) | TTFT p99 (s) "
        "| goodput (req/s) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for link, link_overrides in LINKS.items():
        for write, load in CHOICES:
            m = shared_run([
                "+experiment=mooncake_synthetic", f"replay.path={MOONCAKE}",
                f"replay.limit={limit}", "replay.time_scale=1", "cluster=shared_tier",
                "router=round_robin", "policy=lru", *link_overrides,
                f"cluster.shared_tier.write={write}", f"cluster.shared_tier.load={load}",
            ])  # fmt: skip
            rows.append(shared_row(link, write, load, m))
            print(rows[-1], flush=True)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    head = (
        f"{SHARED_HEAD}\n\n"
        f"Command: `python experiments/kv_tier.py --part shared --limit {limit} "
        f"--out experiments/kv_tier.md` ({date}, commit {commit}, load average "
        f"{load_start:.1f} -> {os.getloadavg()[0]:.1f} on the shared 2-core machine). The first "
        f"{limit} requests of the Mooncake synthetic trace at its recorded rate, 4 H200 replicas "
        "(LRU, CPU tier on), round robin, a 1000 GB LRU store; one seed (replay is "
        "deterministic). Restore paid: CPU reloads + recomputes of blocks a replica had cached + "
        "tier loads + tier runs recomputed instead of loaded (`cheaper`).\n\n"
    )
    text = head + "\n".join(rows) + "\n"
    if out:
        old = out.read_text() if out.exists() else ""
        kept = old[: old.index(SHARED_HEAD)] if SHARED_HEAD in old else old
        out.write_text(kept.rstrip("\n") + "\n\n" + text if kept else text)


def fmt(values: list[float], spec: str) -> str:
    v = np.array(values, dtype=float)
    sd = v.std(ddof=1) if v.size > 1 else 0.0
    return f"{spec.format(v.mean())} ± {spec.format(sd)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--part", choices=("gpu", "shared"), default="gpu")
    parser.add_argument("--limit", type=int, default=1200, help="shared: first N trace requests")
    args = parser.parse_args()
    register_configs()
    if args.part == "shared":
        shared_section(args.limit, args.out)
        return
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
        old = args.out.read_text() if args.out.exists() else ""
        kept = old[old.index(SHARED_HEAD) :] if SHARED_HEAD in old else ""
        args.out.write_text(text + ("\n" + kept if kept else ""))


if __name__ == "__main__":
    main()
