"""Beyond one GPU, measured (issue 17, experiments 6a, 6b and 6c); writes markdown tables.

6a: every router on the Mooncake synthetic trace (multi-turn, shared 512-token prefix blocks) at
4 and 16 replicas of one H200 each, the trace's arrival rate scaled with the replica count so that
each GPU sees the same load (4 replicas: the recorded rate; 16: four times it).
6b: co-located vs prefill/decode-disaggregated at an equal GPU count (4), across prompt/output
ratios, on generated traces of fixed lengths without shared prefixes (Poisson arrivals).
6c: 6a's 4-replica case with a shared KV tier (cluster/shared_tier.py) off and on, for round robin
and prefix-aware routing: hit ratio (and the share the tier served), recompute and network seconds
actually paid, prefill tokens computed, TTFT, goodput.

    python experiments/cluster_experiments.py [--limit 1200] [--num 600] [--parts 6a,6b,6c]
        [--out experiments/cluster_experiments.md]

With `--out`, the sections run replace theirs in the file; the others are kept.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.sim import make_simulation

CONF = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
ROUTERS = ["round_robin", "least_outstanding", "least_kv", "session_affinity", "prefix_aware"]
TRACE = os.environ.get("CACHEPILOT_TRACES_DIR", "../shared/traces")
MOONCAKE = f"{TRACE}/mooncake_synthetic/synthetic_trace.jsonl"
# 6b: (prompt tokens, output tokens) per request, and the arrival rate of the 4-GPU cluster.
RATIOS = [(8192, 64), (4096, 256), (2048, 512), (512, 1024)]
RATE_PER_S = 6.0


def run(overrides: list[str]) -> dict[str, Any]:
    """One simulation (one seed, the config's policy) of the composed config; its metrics, plus
    `prefill_tokens` (tokens the replicas computed, summed over requests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_config(compose("config", overrides=[*overrides, "trace.enabled=false"]))
    sim = make_simulation(cfg.sim_for(cfg.policy.name, cfg.seed))
    metrics = sim.run().metrics
    return metrics | {"prefill_tokens": sum(r.prefill_tokens for r in sim.clients.requests)}


def routing(limit: int) -> list[str]:
    """6a rows: router x replicas -> hit ratio, TTFT p50/p99, goodput, load imbalance."""
    rows = [
        "| replicas | router | prefix hit ratio | TTFT p50 (s) | TTFT p99 (s) | E2E p99 (s) "
        "| goodput (req/s) | load max/mean |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for replicas in (4, 16):
        for router in ROUTERS:
            m = run([
                "+experiment=mooncake_synthetic", f"replay.path={MOONCAKE}",
                f"replay.limit={limit}", f"replay.time_scale={4 / replicas}",
                f"cluster.replicas={replicas}", f"router={router}", "policy=lru",
            ])  # fmt: skip
            rows.append(
                f"| {replicas} | {router} | {m['cluster_hit_ratio']:.3f} | {m['ttft_p50_s']:.2f} "
                f"| {m['ttft_p99_s']:.2f} | {m['e2e_p99_s']:.2f} | {m['goodput_req_s']:.2f} "
                f"| {m['load_imbalance']:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


def shared_tier(limit: int) -> list[str]:
    """6c rows: 4 replicas, router x shared tier (off; 1000 GB LRU; 300 and 100 GB by LRU,
    S3-FIFO, PERC); the GPUs evict by LRU throughout."""
    rows = [
        "| router | shared tier | hit ratio (GPU + tier) | of it from the tier | prefill Mtok "
        "| recompute s | tier load s | tier write s | TTFT p50 (s) | TTFT p99 (s) "
        "| goodput (req/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tiers = [("off", 0, "lru"), ("1000 GB lru", 1000, "lru")]
    tiers += [(f"{gb} GB {p}", gb, p) for gb in (300, 100) for p in ("lru", "s3fifo", "perc")]
    for router in ("round_robin", "prefix_aware"):
        for name, gb, policy in tiers:
            m = run([
                "+experiment=mooncake_synthetic", f"replay.path={MOONCAKE}",
                f"replay.limit={limit}", "replay.time_scale=1", "cluster=shared_tier",
                f"cluster.shared_tier.capacity_gb={gb}", f"cluster.shared_tier.policy={policy}",
                f"router={router}", "policy=lru",
            ])  # fmt: skip
            rows.append(
                f"| {router} | {name} | {m['cluster_hit_ratio']:.3f} "
                f"| {m.get('shared_hit_ratio', 0.0):.3f} | {m['prefill_tokens'] / 1e6:.2f} "
                f"| {m['realized_recompute_s']:.1f} | {m.get('shared_load_s', 0.0):.1f} "
                f"| {m.get('shared_write_s', 0.0):.1f} | {m['ttft_p50_s']:.2f} "
                f"| {m['ttft_p99_s']:.2f} | {m['goodput_req_s']:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


def write_trace(path: Path, prompt: int, output: int, num: int, seed: int = 0) -> None:
    """A Mooncake-format trace: Poisson arrivals at RATE_PER_S, fixed lengths, unique blocks."""
    rng = np.random.default_rng(seed)
    t_ms = np.cumsum(rng.exponential(1000.0 / RATE_PER_S, num))
    blocks, next_hash = math.ceil(prompt / 512), 0
    with path.open("w") as f:
        for t in t_ms:
            ids = list(range(next_hash, next_hash + blocks))
            next_hash += blocks
            row = {"timestamp": int(t), "input_length": prompt, "output_length": output}
            f.write(json.dumps(row | {"hash_ids": ids}) + "\n")


def disaggregation(num: int) -> list[str]:
    """6b rows: per prompt/output ratio, 4 co-located GPUs vs P/D splits of 4."""
    rows = [
        "| prompt:output | cluster | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (ms) "
        "| TPOT p95 (ms) | SLO attainment | goodput (req/s) | handover (GB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    shapes = [
        ("4 co-located", ["cluster.replicas=4", "router=least_outstanding"]),
        ("P/D 1+3", ["cluster.prefill_replicas=1", "cluster.decode_replicas=3"]),
        ("P/D 2+2", ["cluster.prefill_replicas=2", "cluster.decode_replicas=2"]),
        ("P/D 3+1", ["cluster.prefill_replicas=3", "cluster.decode_replicas=1"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for prompt, output in RATIOS:
            path = Path(tmp) / f"fixed_{prompt}_{output}.jsonl"
            write_trace(path, prompt, output, num)
            for name, shape in shapes:
                extra = [] if "co-located" in name else ["router=least_outstanding"]
                m = run([
                    "+experiment=mooncake_synthetic", f"replay.path={path}", "replay.time_scale=1",
                    "replay.ttft_slo_ms=2000", "replay.tpot_slo_ms=50", "policy=lru",
                    *shape, *extra,
                ])  # fmt: skip
                rows.append(
                    f"| {prompt}:{output} | {name} | {m['ttft_p50_s']:.2f} | {m['ttft_p99_s']:.2f} "
                    f"| {m['tpot_p50_ms']:.1f} | {m['tpot_p95_ms']:.1f} "
                    f"| {m['sla_attainment']:.3f} | {m['goodput_req_s']:.2f} "
                    f"| {m.get('handover_gb', 0.0):.1f} |"
                )
                print(rows[-1], flush=True)
    return rows


SECTIONS = {"6a": "### 6a: routers", "6b": "### 6b: P/D", "6c": "### 6c: shared KV tier"}


def merge_sections(old: str, new: dict[str, list[str]]) -> str:
    """`old` (a file of `### ` sections) with the sections in `new` replaced or added."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in old.splitlines():
        if line.startswith("### "):
            current = next((k for k, h in SECTIONS.items() if line == h), line)
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    parts |= new
    out: list[str] = []
    for key in sorted(parts, key=lambda k: (k not in SECTIONS, k)):
        body = parts[key]
        out += [""] if out and out[-1] else []
        out += [SECTIONS.get(key, key), *([""] if body and body[0] else []), *body]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1200, help="6a, 6c: first N trace requests")
    parser.add_argument("--num", type=int, default=600, help="6b: requests per generated trace")
    parser.add_argument("--parts", default="6a,6b,6c", help="comma-separated sections to run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    register_configs()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    makers = {"6a": lambda: routing(args.limit), "6b": lambda: disaggregation(args.num)}
    makers["6c"] = lambda: shared_tier(args.limit)
    sections: dict[str, list[str]] = {}
    for part in args.parts.split(","):
        start = time.perf_counter()
        rows = makers[part]()
        head = (
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, "
            f"{time.perf_counter() - start:.0f} s wall, load average {os.getloadavg()[0]:.1f}; "
            f"`python experiments/cluster_experiments.py --limit {args.limit} --num {args.num} "
            f"--parts {part}`."
        )
        sections[part] = [head, "", *rows, ""]
    old = args.out.read_text() if args.out is not None and args.out.exists() else ""
    text = merge_sections(old, sections)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
