"""The policy frontier: every online eviction policy next to the clairvoyant one and the offline LP
bound, on each workload, offload on and off, at two VRAM sizes (not a test).

Each cell (workload, VRAM, offload, policy, seed) is one simulation; finished cells are appended
to a JSON-lines file, so a run can be stopped and resumed and a later one adds what is missing. The
report reads every cell there: realized restore s, TTFT p99, goodput; the ratio of realized
restore to LRU's paired by seed with a 95 % t interval (one seed, a trace: a paired bootstrap over
requests); and the share of LRU's excess over `perc_clairvoyant` (and over the LP bound) that the
best classical and the best online policy close.

    python experiments/policy_frontier.py --workloads mixed_spike --jobs 2      # run, then report
    python experiments/policy_frontier.py --jobs 8                               # the full grid
    python experiments/policy_frontier.py --report-only                          # just the .md
    python experiments/policy_frontier.py --policies lru perc reuse_forecast    # another list
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.config import SimConfig, register_configs, to_config
from cachepilot_sim.experiment.offline import offline_metrics
from cachepilot_sim.experiment.report import mean_ci
from cachepilot_sim.sim import build

HERE = Path(__file__).resolve().parent
CONF = HERE.parent / "cachepilot_sim" / "conf"
CELLS = HERE / "policy_frontier" / "cells.jsonl"
OUT = HERE / "policy_frontier.md"


@dataclass(frozen=True)
class Workload:
    """An experiment config run at two VRAM sizes (the first its own, the second smaller or
    larger), `seeds` seeds each."""

    experiment: str
    seeds: int
    vram_gb: tuple[float, float]
    # False where the offline LP does not apply (it models whole-session KV, not prefix blocks)
    offline_lp: bool = True
    note: str = ""  # printed under each of the workload's tables


_NO_REUSE = (
    "The Azure 2023 traces carry no session or prefix ids: no request reuses another's KV, so no "
    "eviction is ever paid back and every policy pays 0 s of restore by construction. These rows "
    "show only that no policy costs TTFT or goodput there; they say nothing about eviction."
)
WORKLOADS = {
    "mixed_spike": Workload("mixed_spike", 10, (16.0, 12.0)),
    "mooncake": Workload(
        "mooncake_synthetic",
        1,
        (141.0, 24.0),
        offline_lp=False,
        note="Prefix blocks, not sessions: perc_clairvoyant knows each session's next arrival, "
        "not which of its blocks the next request shares, so it is no bound here (it pays about "
        "what LRU pays), and the offline LP (whole-session KV) is not computed.",
    ),
    "azure_code": Workload("azure_code", 1, (16.0, 12.0), note=_NO_REUSE),
    "azure_conv": Workload("azure_conv", 1, (16.0, 12.0), note=_NO_REUSE),
}
# Classical: rules from the caching literature that read no reuse model (LRU is the baseline).
CLASSICAL = ["fifo", "lfu", "slru", "arc", "gdsf", "s3fifo", "sieve"]
# Online: everything a server could run, including the reuse-model policies.
ONLINE = [*CLASSICAL, "priority", "marconi", "wild", "tlru", "lrb", "perc", "perc_hazard",
          "reuse_forecast"]  # fmt: skip
# reuse_forecast's survival table per workload (policies/forecast_tables/; default mixed_spike):
# a trace replay reads the table trained on the trace's own first half.
FORECAST_TABLES = {"mooncake": "mooncake_synthetic"}
REFERENCE = "perc_clairvoyant"  # fed the true next arrival: not online
DEFAULT_POLICIES = ["lru", *ONLINE, REFERENCE]
METRICS = ("realized_restore_s", "ttft_p99_s", "goodput_req_s", "completed", "rejected")
BOOTSTRAP_DRAWS = 2000


def cell_id(workload: str, vram_gb: float, offload: bool, policy: str, seed: int) -> str:
    return f"{workload}|{vram_gb:g}|{'on' if offload else 'off'}|{policy}|{seed}"


def sim_configs(
    name: str, vram_gb: float, offload: bool, policies: list[str], seeds: int
) -> list[SimConfig]:
    """Every (policy, seed) SimConfig of one setting, composed as the CLI would."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run = to_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={WORKLOADS[name].experiment}",
                    f"vram_gb={vram_gb}",
                    f"kv.offload_enabled={str(offload).lower()}",
                    "trace.enabled=false",
                    "write_requests=false",
                ],
            )
        )
    cfgs = [run.sim_for(p, s) for p in policies for s in range(run.seed, run.seed + seeds)]
    table = FORECAST_TABLES.get(name)
    return [
        replace(c, policy=replace(c.policy, forecast_model=table))
        if table and c.policy.name == "reuse_forecast"
        else c
        for c in cfgs
    ]


def run_one(key: str, sim_cfg: SimConfig, with_lp: bool, keep_requests: bool) -> dict[str, Any]:
    """One simulation: the report's metrics, the LP bound when asked, and per-request restore
    seconds (by request id) when the setting has one seed (the bootstrap needs them)."""
    result = build(sim_cfg).run()
    cell: dict[str, Any] = {"cell": key, **{m: result.metrics[m] for m in METRICS}}
    if with_lp:
        cell["offline_lp_restore_s"] = offline_metrics(sim_cfg, result.requests)[
            "offline_lp_restore_s"
        ]
    if keep_requests:
        frame = result.requests.sort("request")
        restore = frame["reload_us"].cast(float) + frame["recompute_us"]
        cell["request_restore_ms"] = [round(v / 1e3, 3) for v in restore.to_list()]
    return cell


def load_cells(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    cells = {}
    for line in path.read_text().splitlines():
        if line.strip():
            c = json.loads(line)
            cells[c["cell"]] = c
    return cells


def run_grid(args: argparse.Namespace) -> None:
    """Run every missing cell of the chosen grid on `--jobs` processes, appending as they end."""
    done = load_cells(args.cells)
    todo: list[tuple[str, SimConfig, bool, bool]] = []
    for name in args.workloads:
        w = WORKLOADS[name]
        seeds = min(w.seeds, args.seeds or w.seeds)
        for vram in w.vram_gb:
            for offload in (True, False):
                for cfg in sim_configs(name, vram, offload, args.policies, seeds):
                    key = cell_id(name, vram, offload, cfg.policy.name, cfg.seed)
                    if key not in done:
                        todo.append((key, cfg, cfg.policy.name == "lru", w.seeds == 1))
    print(f"{len(todo)} cells to run ({len(done)} already in {args.cells})", flush=True)
    args.cells.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    # spawn, not fork: polars keeps a thread pool, and a forked child can deadlock on it.
    context = multiprocessing.get_context("spawn")
    with args.cells.open("a") as sink, ProcessPoolExecutor(args.jobs, context) as pool:
        futures = [pool.submit(run_one, *item) for item in todo]
        for n, future in enumerate(as_completed(futures), start=1):
            cell = future.result()
            sink.write(json.dumps(cell) + "\n")
            sink.flush()
            elapsed = time.monotonic() - start
            print(f"[{n}/{len(todo)} {elapsed:.0f}s] {cell['cell']}", flush=True)
    record = {
        "finished_utc": f"{datetime.now(UTC):%Y-%m-%d %H:%M}",
        "command": " ".join(["python experiments/policy_frontier.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "cells_run": len(todo),
        "wall_s": round(time.monotonic() - start),
        "load_avg_1min": round(os.getloadavg()[0], 1),
        "cores": os.cpu_count(),
    }
    with args.cells.with_name("runs.jsonl").open("a") as runs:
        runs.write(json.dumps(record) + "\n")


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()


def paired_ratio(
    cells: dict[str, dict[str, Any]], base: str, policy: str, seeds: list[int]
) -> tuple[float, float, float, int] | None:
    """Mean ratio of realized restore to LRU's over paired seeds with its 95 % interval (low,
    high); one seed: the ratio of sums with a paired bootstrap over requests. Seeds where LRU
    paid no restore at all have no ratio and are left out (None when no seed is left)."""
    pairs = [
        (cells[f"{base}|{policy}|{s}"], cells[f"{base}|lru|{s}"])
        for s in seeds
        if f"{base}|{policy}|{s}" in cells
        and f"{base}|lru|{s}" in cells
        and cells[f"{base}|lru|{s}"]["realized_restore_s"] > 0
    ]
    if not pairs:
        return None
    if len(pairs) > 1:
        r = np.array([p["realized_restore_s"] / q["realized_restore_s"] for p, q in pairs])
        mean, half = mean_ci(r)
        return mean, mean - half, mean + half, len(r)
    p, q = pairs[0]
    ratio = p["realized_restore_s"] / q["realized_restore_s"]
    a, b = p.get("request_restore_ms"), q.get("request_restore_ms")
    if not a or not b or len(a) != len(b):
        return ratio, float("nan"), float("nan"), 1
    x, y = np.asarray(a), np.asarray(b)
    rng = np.random.default_rng(0)
    draws = rng.integers(0, x.size, (BOOTSTRAP_DRAWS, x.size))
    boot = x[draws].sum(axis=1) / np.maximum(y[draws].sum(axis=1), 1e-9)
    low, high = np.percentile(boot, [2.5, 97.5])
    return ratio, float(low), float(high), 1


def fmt_mean(values: list[float], spec: str) -> str:
    v = np.asarray(values, dtype=float)
    if v.size == 1:
        return spec.format(v[0])
    return f"{spec.format(v.mean())} ± {spec.format(v.std(ddof=1))}"


def setting_table(
    cells: dict[str, dict[str, Any]], name: str, vram: float, offload: bool, policies: list[str]
) -> tuple[list[str], dict[str, float]]:
    """The rows of one setting, and each policy's mean realized restore (for the gap summary)."""
    w = WORKLOADS[name]
    base = f"{name}|{vram:g}|{'on' if offload else 'off'}"
    seeds = list(range(w.seeds))
    rows, means = [], {}
    for p in policies:
        got = [cells[f"{base}|{p}|{s}"] for s in seeds if f"{base}|{p}|{s}" in cells]
        if not got:
            continue
        restore = [c["realized_restore_s"] for c in got]
        means[p] = float(np.mean(restore))
        ratio = paired_ratio(cells, base, p, seeds)
        ratio_txt = (
            "n/a (LRU paid no restore)"
            if ratio is None
            else f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]"
        )
        rows.append(
            f"| {p} | {len(got)} | {fmt_mean(restore, '{:.2f}')} | {ratio_txt} | "
            f"{fmt_mean([c['ttft_p99_s'] for c in got], '{:.2f}')} | "
            f"{fmt_mean([c['goodput_req_s'] for c in got], '{:.3f}')} | "
            f"{sum(c['rejected'] for c in got)} |"
        )
    lp = [
        cells[f"{base}|lru|{s}"]["offline_lp_restore_s"]
        for s in seeds
        if "offline_lp_restore_s" in cells.get(f"{base}|lru|{s}", {})
    ]
    if lp and w.offline_lp:
        means["LP bound"] = float(np.mean(lp))
        rows.append(f"| LP bound (offline, LRU's access sequence) | {len(lp)} | "
                    f"{fmt_mean(lp, '{:.2f}')} | | | | |")  # fmt: skip
    return rows, means


def gap_closed(means: dict[str, float]) -> list[str]:
    """Share of LRU's excess over the clairvoyant policy (and the LP bound) that the best
    classical and the best online policy close: (LRU - X) / (LRU - reference)."""
    if "lru" not in means:
        return []
    out = []
    for label, group in (("classical", CLASSICAL), ("online", ONLINE)):
        have = {p: means[p] for p in group if p in means}
        if not have:
            continue
        best = min(have, key=lambda p: have[p])
        parts = [f"best {label}: **{best}** {have[best]:.2f} s (LRU {means['lru']:.2f} s)"]
        for ref in (REFERENCE, "LP bound"):
            if ref not in means:
                continue
            if means[ref] >= 0.99 * means["lru"]:
                parts.append(f"{ref} ({means[ref]:.2f} s) is within 1 % of LRU: no gap to close")
            elif have[best] < means[ref]:
                parts.append(f"beats {ref} ({means[ref]:.2f} s)")
            else:
                closed = (means["lru"] - have[best]) / (means["lru"] - means[ref])
                parts.append(f"closes {closed:.0%} of the gap to {ref} ({means[ref]:.2f} s)")
        out.append("- " + "; ".join(parts))
    return out


def report(args: argparse.Namespace) -> str:
    cells = load_cells(args.cells)
    root = HERE.parent
    shown = (
        args.cells.resolve().relative_to(root)
        if args.cells.resolve().is_relative_to(root)
        else args.cells
    )
    runs_file = args.cells.with_name("runs.jsonl")
    runs = runs_file.read_text().splitlines() if runs_file.exists() else []
    lines = [
        "# Policy frontier: online eviction policies vs clairvoyance",
        "",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {git_commit()} on "
        f"{platform.node() or 'unknown'} from {len(cells)} cells in `{shown}`, by "
        f"`python experiments/policy_frontier.py --report-only` (no simulation). The cells came "
        f"from these runs (`{runs_file.name}`: command, commit, wall time, machine load):",
        "",
        *[f"    {r}" for r in runs],
        "",
        "Realized restore s is what the run paid (reload + recompute); mean ± σ over seeds. "
        "*vs LRU* is realized restore over LRU's on the same seed, mean and 95 % t interval over "
        "seeds; for a trace (one seed) the ratio of sums with a 95 % paired bootstrap over "
        "requests (it sees request-level noise only, not run-to-run variation: treat it as n=1). "
        "*rej* counts rejected requests. The LP bound is the offline lower bound over LRU's "
        "recorded access sequence. Gap closed = (LRU − best) / (LRU − reference), on mean "
        "realized restore.",
    ]
    missing = []
    for name, w in WORKLOADS.items():
        for vram in w.vram_gb:
            for offload in (True, False):
                rows, means = setting_table(cells, name, vram, offload, args.policies)
                exp = "" if w.experiment == name else f" ({w.experiment})"
                title = f"{name}{exp}, {vram:g} GB, offload {'on' if offload else 'off'}"
                want = len(args.policies) * w.seeds
                have = sum(1 for r in rows if not r.startswith("| LP"))
                if not rows:
                    missing.append(f"- {title}: not run")
                    continue
                if have < len(args.policies):
                    missing.append(f"- {title}: {have} of {len(args.policies)} policies")
                lines += ["", f"## {title}", "", f"{want} cells wanted.", ""]
                lines += [w.note, ""] if w.note else []
                lines += gap_closed(means) + [""]
                lines += [
                    "| policy | n | realized restore s | vs LRU [95 % CI] | TTFT p99 s | "
                    "goodput req/s | rej |",
                    "|---|---:|---:|---:|---:|---:|---:|",
                    *rows,
                ]
    if missing:
        lines += ["", "## Not in this file yet", "", *missing, "",
                  "Run them with `python experiments/policy_frontier.py --jobs N` "
                  "(resumes: only missing cells run)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--policies", nargs="+", default=DEFAULT_POLICIES)
    parser.add_argument("--seeds", type=int, default=0, help="at most this many seeds (smoke)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cells", type=Path, default=CELLS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    register_configs()
    from cachepilot_sim.policies import known_policies

    unknown = sorted(set(args.policies) - set(known_policies()))
    if unknown:
        print(f"error: --policies: unknown {unknown}; known: {known_policies()}", file=sys.stderr)
        raise SystemExit(2)
    if "lru" not in args.policies:
        print("error: --policies must include lru (every ratio is paired with it)", file=sys.stderr)
        raise SystemExit(2)
    if not args.report_only:
        run_grid(args)
    args.out.write_text(report(args))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
