"""reuse_forecast against the online policies: realized restore vs LRU, ablations, calibration.

    python experiments/reuse_forecast.py eval        # mixed_spike seeds 0-9, every online policy
    python experiments/reuse_forecast.py ablate      # feature subsets, pricing, delta
    python experiments/reuse_forecast.py wrong       # forecasts that say "never" for returners
    python experiments/reuse_forecast.py calibrate   # predicted vs realized next use (PNG)
    python experiments/reuse_forecast.py mooncake    # the whole Mooncake trace, second half apart
    python experiments/reuse_forecast.py online      # + policy.forecast_online=true, seeds 0-9
    python experiments/reuse_forecast.py mooncake --online   # its row on the Mooncake trace
    python experiments/reuse_forecast.py transfer    # mooncake's table on mixed_spike seeds 0-9
    python experiments/reuse_forecast.py mooncake --transfer  # mixed_spike's table on the trace
    python experiments/reuse_forecast.py drift       # think times x3 from request 400: online?

Evaluation seeds 0-9 and the second half of the Mooncake trace; the shipped tables were trained
on seeds 100-199 and on the first half of the trace (cachepilot-sim train-forecast). Results go to
experiments/reuse_forecast/*.json; experiments/reuse_forecast.md reads them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from scipy import stats

from cachepilot_sim.config import SimConfig, policy_config, register_configs, to_config
from cachepilot_sim.policies.forecast_model import model_path
from cachepilot_sim.sim import build
from cachepilot_sim.tools import CONF_DIR
from cachepilot_sim.tools.forecast_data import fit_table, load_rows
from cachepilot_sim.tools.train_forecast import GRID

OUT = Path(__file__).with_name("reuse_forecast")
EVAL_SEEDS = range(10)
ONLINE = ["lru", "fifo", "lfu", "slru", "arc", "priority", "gdsf", "marconi", "wild", "tlru",
          "perc", "perc_hazard", "perc_plus1"]  # fmt: skip
REFERENCE = ["perc_clairvoyant"]
ROWS = Path("outputs/forecast/mixed_spike_rows.parquet")


def base(experiment: str, overrides: list[str]) -> SimConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_config(
            compose("config", [f"+experiment={experiment}", "trace.enabled=false", *overrides])
        )
    return cfg.sim_for(cfg.policy.name, 0)


def run(cfg: SimConfig, name: str, seed: int, **knobs: object) -> dict:
    sim = build(replace(cfg, seed=seed, policy=policy_config(name, **knobs)))
    m = sim.run().metrics
    keep = ("realized_restore_s", "ttft_p99_s", "goodput_req_s", "evictions", "forecast_delta_s")
    return {k: m[k] for k in keep if k in m}


def paired(rows: dict[str, list[dict]], base_name: str = "lru") -> dict[str, dict]:
    """Per policy: mean restore ratio to LRU (paired by seed) with its 95 % t interval."""
    ref = np.array([r["realized_restore_s"] for r in rows[base_name]])
    out = {}
    for name, rs in rows.items():
        ratio = np.array([r["realized_restore_s"] for r in rs]) / ref
        half = stats.t.ppf(0.975, len(ratio) - 1) * ratio.std(ddof=1) / np.sqrt(len(ratio))
        out[name] = {
            "ratio": float(ratio.mean()),
            "ci95": float(half),
            "restore_s": float(np.mean([r["realized_restore_s"] for r in rs])),
            "ttft_p99_s": float(np.mean([r["ttft_p99_s"] for r in rs])),
            "goodput_req_s": float(np.mean([r["goodput_req_s"] for r in rs])),
        }
    return out


def table(summary: dict[str, dict]) -> str:
    lines = ["| policy | restore s | vs LRU (95 % CI) | TTFT p99 s | goodput req/s |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, s in sorted(summary.items(), key=lambda kv: kv[1]["ratio"]):
        lines.append(
            f"| {name} | {s['restore_s']:.3f} | {s['ratio']:.3f} ± {s['ci95']:.3f} | "
            f"{s['ttft_p99_s']:.3f} | {s['goodput_req_s']:.4f} |"
        )
    return "\n".join(lines)


def evaluate(
    variants: dict[str, tuple[str, dict]], cfg: SimConfig, out: str, redo: set[str]
) -> dict:
    """Each variant on the evaluation seeds; variants already in the results file are kept
    unless named in `redo` (a baseline need not be re-run when the forecast changes)."""
    path = OUT / f"{out}.json"
    rows = json.loads(path.read_text())["seeds"] if path.exists() else {}
    for label, (name, knobs) in variants.items():
        if label not in rows or label in redo:
            rows[label] = [run(cfg, name, s, **knobs) for s in EVAL_SEEDS]
            print(label, "done", flush=True)
    rows = {k: rows[k] for k in variants}
    summary = paired(rows)
    OUT.mkdir(exist_ok=True)
    path.write_text(json.dumps({"seeds": rows, "summary": summary}, indent=1))
    print(table(summary))
    return summary


def cmd_eval(only_baselines: bool) -> None:
    names = [*ONLINE, *REFERENCE] + ([] if only_baselines else ["reuse_forecast"])
    variants: dict[str, tuple[str, dict]] = {p: (p, {}) for p in names}
    evaluate(variants, base("mixed_spike", []), "mixed_spike", {"reuse_forecast"})


ONLINE_KNOBS: dict[str, object] = {"forecast_online": True}
# A sensitivity, not a tuned setting: a prior worth 10 releases instead of 100 adapts faster.
ONLINE_FAST: dict[str, object] = {**ONLINE_KNOBS, "forecast_online_prior": 10.0}


def cmd_online() -> None:
    """The online-updated table on the eval seeds, paired against the committed LRU and offline
    reuse_forecast rows of mixed_spike.json (the same seeds and config; not re-run)."""
    committed = json.loads((OUT / "mixed_spike.json").read_text())["seeds"]
    path = OUT / "online.json"
    if not path.exists():
        keep = {k: committed[k] for k in ("lru", "reuse_forecast")}
        path.write_text(json.dumps({"seeds": keep}, indent=1))
    variants = {"lru": ("lru", {}), "reuse_forecast": ("reuse_forecast", {}),
                "reuse_forecast online": ("reuse_forecast", ONLINE_KNOBS),
                "reuse_forecast online prior 10": ("reuse_forecast", ONLINE_FAST)}  # fmt: skip
    redo = {"reuse_forecast online", "reuse_forecast online prior 10"}
    evaluate(variants, base("mixed_spike", []), "online", redo)
    data = json.loads(path.read_text())
    vs = paired(data["seeds"], "reuse_forecast")
    data["vs_offline"] = {k: vs[k] for k in sorted(redo)}
    path.write_text(json.dumps(data, indent=1))
    print("online vs offline reuse_forecast:", json.dumps(data["vs_offline"]))


def cmd_ablate() -> None:
    rows = load_rows(ROWS)
    variants: dict[str, tuple[str, dict]] = {"lru": ("lru", {})}
    subsets = {"class": ("class",), "class+tokens": ("class", "tokens"),
               "class+tokens+turn": ("class", "tokens", "turn"),
               "no class": ("tokens", "turn", "last_gap", "mean_gap", "rate"),
               "history only": ("last_gap", "mean_gap", "rate"),
               "population (no features)": ()}  # fmt: skip
    for label, feats in subsets.items():
        path = Path("outputs/forecast") / f"ablate_{'_'.join(feats) or 'none'}.json"
        fit_table(rows, feats, GRID, 100, 20.0, {"ablation": label}).save(path)
        variants[f"features: {label}"] = ("reuse_forecast", {"forecast_model": str(path)})
    variants["all features (shipped)"] = ("reuse_forecast", {})
    variants["forecast only (no restore pricing)"] = (
        "reuse_forecast",
        {"forecast_pricing": "none"},
    )
    variants["fixed delta 30 s"] = ("reuse_forecast", {"forecast_delta": "fixed"})
    evaluate(variants, base("mixed_spike", []), "ablate", set(variants) - {"lru"})


def cmd_wrong() -> None:
    """The cost of being wrong: a share of the releases of sessions that do return get the
    forecast 'never returns' (P = 0), chosen by a seeded hash of the entry id."""
    cfg = base("mixed_spike", [])
    out: dict[str, list[dict]] = {"lru": [run(cfg, "lru", s) for s in EVAL_SEEDS]}
    for share in (0.0, 0.1, 0.3):
        res = []
        for seed in EVAL_SEEDS:
            sim = build(replace(cfg, seed=seed, policy=policy_config("reuse_forecast")))
            _blind(sim.policy, share)
            m = sim.run().metrics
            res.append({k: m[k] for k in ("realized_restore_s", "ttft_p99_s", "goodput_req_s")})
        out[f"never-forecast for {share:.0%} of returning sessions"] = res
    summary = paired(out)
    (OUT / "wrong.json").write_text(json.dumps({"seeds": out, "summary": summary}, indent=1))
    print(table(summary))


def _blind(policy: object, share: float) -> None:
    table_ = policy.table  # type: ignore[attr-defined]
    never_row = len(table_.keys)
    table_.curves = np.vstack([table_.curves, np.ones(table_.curves.shape[1])])
    table_._rows.append([1.0] * table_.curves.shape[1])  # S = 1: never comes back
    release = policy.on_release  # type: ignore[attr-defined]

    def on_release(entry, now_us):  # type: ignore[no-untyped-def]
        release(entry, now_us)
        if entry.next_arrival_us >= 0 and (entry.entry_id * 2654435761 % 1000) < share * 1000:
            policy.rows[entry.entry_id] = never_row  # type: ignore[attr-defined]

    policy.on_release = on_release  # type: ignore[attr-defined]


def cmd_calibrate() -> None:
    from reuse_forecast_calibration import calibration  # experiments/ sibling

    calibration(base("mixed_spike", []), EVAL_SEEDS, OUT)


def cmd_transfer() -> None:
    """Transfer, trace to synthetic: the table trained on the Mooncake trace's first half ranks
    mixed_spike's sessions (seeds 0-9), paired against the committed LRU and in-domain rows."""
    committed = json.loads((OUT / "mixed_spike.json").read_text())["seeds"]
    path = OUT / "transfer.json"
    if not path.exists():
        keep = {k: committed[k] for k in ("lru", "reuse_forecast")}
        path.write_text(json.dumps({"seeds": keep}, indent=1))
    label = "reuse_forecast (mooncake_synthetic table)"
    variants = {"lru": ("lru", {}), "reuse_forecast": ("reuse_forecast", {}),
                label: ("reuse_forecast", {"forecast_model": "mooncake_synthetic"})}  # fmt: skip
    evaluate(variants, base("mixed_spike", []), "transfer", {label})
    data = json.loads(path.read_text())
    data["vs_in_domain"] = paired(data["seeds"], "reuse_forecast")[label]
    path.write_text(json.dumps(data, indent=1))
    print("vs the in-domain table:", json.dumps(data["vs_in_domain"]))


DRIFT = ["workload.think_drift_multiplier=3", "workload.think_drift_at_request=400"]


def cmd_drift() -> None:
    """Reuse that drifts away from the training data: mixed_spike with every think time that
    starts after request 400 three times longer. Does the online update recover what the
    offline table (trained without drift) loses?"""
    variants = {"lru": ("lru", {}), "perc": ("perc", {}), "lfu": ("lfu", {}),
                "reuse_forecast": ("reuse_forecast", {}),
                "reuse_forecast online": ("reuse_forecast", ONLINE_KNOBS),
                "perc_clairvoyant": ("perc_clairvoyant", {})}  # fmt: skip
    evaluate(variants, base("mixed_spike", DRIFT), "drift", set())
    path = OUT / "drift.json"
    data = json.loads(path.read_text())
    data["online_vs_offline"] = paired(data["seeds"], "reuse_forecast")["reuse_forecast online"]
    data["overrides"] = DRIFT
    path.write_text(json.dumps(data, indent=1))
    print("online vs offline:", json.dumps(data["online_vs_offline"]))


def cmd_mooncake(limit: int, online: bool, transfer: bool = False) -> None:
    """LRU, LFU and reuse_forecast on the trace; with `online` (or `transfer`: the mixed_spike
    table, synthetic to trace) only that row is run and added to the results file (the others
    are kept from it)."""
    over = [f"replay.limit={limit}"] if limit else []
    cfg = base("mooncake_synthetic", over)
    arrivals = None
    path = OUT / f"mooncake{limit or ''}.json"
    out = json.loads(path.read_text()) if online or transfer else {}
    table: dict[str, object] = {"forecast_model": "mooncake_synthetic"}
    runs: list[tuple[str, str, dict[str, object]]] = [
        ("lru", "lru", {}),
        ("lfu", "lfu", {}),
        ("reuse_forecast", "reuse_forecast", table),
        ("reuse_forecast online", "reuse_forecast", {**table, **ONLINE_KNOBS}),
        ("reuse_forecast online prior 10", "reuse_forecast", {**table, **ONLINE_FAST}),
        ("reuse_forecast (mixed_spike table)", "reuse_forecast", {"forecast_model": "mixed_spike"}),
    ]
    for label, name, knobs in runs:
        if label in out or ("online" in label and not online) or ("(" in label and not transfer):
            continue
        sim = build(replace(cfg, seed=0, policy=policy_config(name, **knobs)))
        m = sim.run().metrics
        reqs = sim.clients.requests
        if arrivals is None:
            t = np.array([r.arrival_us for r in reqs])
            arrivals = t.min() + 0.5 * (t.max() - t.min())
        late = sum(
            (r.recompute_us_paid + r.reload_us_paid) / 1e6 for r in reqs if r.arrival_us > arrivals
        )
        out[label] = {
            "second_half_starts_us": float(arrivals),
            "realized_restore_s": m["realized_restore_s"],
            "second_half_restore_s": late,
            "ttft_p99_s": m["ttft_p99_s"],
            "goodput_req_s": m["goodput_req_s"],
            "prefix_hit_ratio": m.get("prefix_hit_ratio"),
            **{k: v for k, v in m.items() if k.startswith("forecast_online")},
        }
        print(label, json.dumps(out[label]), flush=True)
    ref = out["lru"]
    for v in out.values():
        v["vs_lru"] = v["realized_restore_s"] / ref["realized_restore_s"]
        v["second_half_vs_lru"] = v["second_half_restore_s"] / ref["second_half_restore_s"]
    OUT.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


def cmd_bench() -> None:
    """One decision's wall time (select 1 victim among n idle candidates), PERC vs
    reuse_forecast: both key every candidate (DECISION scope). Figures, not a test."""
    import time

    from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy

    rng = np.random.default_rng(0)
    for n in (1_000, 10_000, 100_000):
        entries = [
            CacheEntry(i, i, 0, int(rng.integers(4)), 0, int(rng.integers(100, 30_000)),
                       int(rng.integers(1, 100)) << 20, 0, int(rng.integers(0, 10**8)),
                       restore_us=float(rng.uniform(1e3, 1e5)))
            for i in range(n)
        ]  # fmt: skip
        for name, knobs in [("perc", {}), ("perc_hazard", {}), ("reuse_forecast", {}),
                            ("reuse_forecast", ONLINE_KNOBS)]:  # fmt: skip
            pc = policy_config(name, **knobs)
            pol = make_policy(pc, GapEstimator(0.3, 20e6, 30e6))
            t0 = time.perf_counter()
            for e in entries:  # online: every release is an observation, refits included
                pol.on_release(e, e.last_used_us)
            t_hooks = time.perf_counter() - t0
            t0 = time.perf_counter()
            pol.select_victims(entries, 1, 2 * 10**8)
            label = name + (" online" if knobs else "")
            print(f"n={n:>7} {label:22s} decision {1e3 * (time.perf_counter() - t0):8.1f} ms"
                  f"  releases {1e6 * t_hooks / n:6.1f} µs each", flush=True)  # fmt: skip


def main() -> None:
    register_configs()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "what",
        choices=[
            "eval",
            "ablate",
            "wrong",
            "calibrate",
            "mooncake",
            "bench",
            "online",
            "transfer",
            "drift",
        ],
    )
    p.add_argument("--online", action="store_true", help="mooncake: add the online row only")
    p.add_argument("--transfer", action="store_true", help="mooncake: the mixed_spike table's row")
    p.add_argument("--limit", type=int, default=0, help="mooncake: first N requests (0: all)")
    p.add_argument("--baselines", action="store_true", help="eval: the baselines only")
    a = p.parse_args()
    assert model_path("mixed_spike").is_file()
    if a.what == "mooncake":
        cmd_mooncake(a.limit, a.online, a.transfer)
    elif a.what == "bench":
        cmd_bench()
    else:
        if a.what == "eval":
            cmd_eval(a.baselines)
        else:
            cmds = {"ablate": cmd_ablate, "wrong": cmd_wrong, "calibrate": cmd_calibrate}
            cmds.update(online=cmd_online, transfer=cmd_transfer, drift=cmd_drift)
            cmds[a.what]()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
