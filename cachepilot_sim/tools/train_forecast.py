"""Train the reuse forecast's survival table (policy=reuse_forecast) from simulator runs.

    cachepilot-sim train-forecast [--out PATH] [--experiment mixed_spike] [--seeds 100-199]

Session workloads (synthetic): one run per training seed with the event trace on, and one row per
release derived from the trace (tools/forecast_data.py). Trace replays (prefix blocks): the trace
fixes the arrivals, so one run (the first training seed) of the first `--first-fraction` of the
trace by time, rows from the policy's own log (`policy.forecast_record=true`). Training never sees
evaluation data: seeds 0-9 are refused, and a replay trains on its first half only.
The output is deterministic (same arguments, same bytes) and goes to outputs/ unless --out names a
file; a shipped table (policies/forecast_tables/<experiment>.json) is only replaced by naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.config import ConfigError, SimConfig, register_configs, to_config
from cachepilot_sim.policies.forecast_features import FEATURES
from cachepilot_sim.policies.forecast_model import shipped_tables
from cachepilot_sim.sim import build
from cachepilot_sim.tools import CONF_DIR
from cachepilot_sim.tools.forecast_data import (
    CENSORED,
    NEVER,
    Row,
    fit_table,
    load_rows,
    release_rows_from_log,
    release_rows_from_trace,
    save_rows,
)
from cachepilot_sim.trace.derive import load_trace
from cachepilot_sim.workloads.replay import load_replay

EVAL_SEEDS = range(0, 10)  # evaluation seeds (experiments/reuse_forecast.md): never trained on
GRID = (0.1, 100_000.0, 41)  # gap grid: 0.1 s .. ~28 h, log-spaced (x1.41 a step)


@dataclass
class Args:
    out: Path
    experiment: str
    seeds: list[int]
    features: tuple[str, ...]
    min_count: int
    prior_weight: float
    policy: str
    first_fraction: float
    overrides: list[str]
    rows_in: Path | None = None
    rows_out: Path | None = None


def compose_config(args: Args, extra: list[str]) -> SimConfig:
    """The experiment's config with the tool's overrides, for the first training seed."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_config(
            compose(
                "config",
                overrides=[f"+experiment={args.experiment}", *args.overrides, *extra],
            )
        )
    return cfg.sim_for(cfg.policy.name, args.seeds[0])


def first_part_limit(cfg: SimConfig, fraction: float) -> int:
    """Requests of the replayed trace that arrive in its first `fraction` of time."""
    from dataclasses import replace

    whole = replace(cfg, replay=replace(cfg.replay, limit=0))
    arrival = load_replay(whole, np.random.default_rng(0)).arrival_us
    cut = arrival.min() + fraction * (arrival.max() - arrival.min())
    leading = np.flatnonzero(arrival > cut)
    return int(leading[0]) if leading.size else len(arrival)


def session_rows(args: Args) -> list[Row]:
    """Rows from the event traces of one run per training seed."""
    from dataclasses import replace

    cfg = compose_config(args, [f"policy={args.policy}", "trace.iteration_every=1000000"])
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="train_forecast_") as tmp:
        for seed in args.seeds:
            trace_dir = Path(tmp) / f"seed{seed}"
            build(replace(cfg, seed=seed), trace_dir).run()
            lf, _ = load_trace(trace_dir)
            rows += release_rows_from_trace(lf.collect())
    return rows


def replay_rows(args: Args) -> tuple[list[Row], int]:
    """Rows from the policy's own log over the first part of the trace; and that part's size."""
    cfg = compose_config(
        args, ["policy=reuse_forecast", "policy.forecast_record=true", "trace.enabled=false"]
    )
    from dataclasses import replace

    limit = first_part_limit(cfg, args.first_fraction)
    sim = build(replace(cfg, replay=replace(cfg.replay, limit=limit)))
    sim.run()
    policy = sim.policy
    log = (policy.release_log, policy.access_log)  # type: ignore[attr-defined]
    # The trace goes on after this part: an unused block is censored, not gone for good.
    return release_rows_from_log(*log, end_us=int(sim.env.now)), limit


def train(args: Args) -> dict[str, object]:
    """Rows, then the table; writes it to args.out and returns a summary."""
    replay = compose_config(args, ["trace.enabled=false"]).replay
    is_replay = bool(replay.path)
    meta: dict[str, object] = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "min_count": args.min_count,
        "prior_weight": args.prior_weight,
    }
    if args.rows_in is not None:
        rows = load_rows(args.rows_in)  # saved by an earlier run of this tool with these seeds
        meta |= {"seeds": [args.seeds[0], args.seeds[-1]], "trace_policy": args.policy}
        if is_replay:
            meta = {k: v for k, v in meta.items() if k not in ("seeds", "trace_policy")}
            meta |= {"seed": args.seeds[0], "first_fraction": args.first_fraction}
    elif is_replay:
        rows, limit = replay_rows(args)
        meta |= {"seed": args.seeds[0], "first_fraction": args.first_fraction, "requests": limit}
    else:
        rows = session_rows(args)
        meta |= {"seeds": [args.seeds[0], args.seeds[-1]], "trace_policy": args.policy}
    if args.rows_out is not None:
        save_rows(rows, args.rows_out)
    never = sum(1 for _, _, g in rows if g == NEVER)
    meta |= {"censored_fraction": round(sum(1 for r in rows if r[2] <= CENSORED) / len(rows), 5)}
    meta |= {"num_rows": len(rows), "never_fraction": round(never / max(len(rows), 1), 5)}
    table = fit_table(rows, args.features, GRID, args.min_count, args.prior_weight, meta)
    table.save(args.out)
    return {"out": str(args.out), "buckets": len(table.keys), **meta}


def _seeds(text: str) -> list[int]:
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-", 1))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not LO-HI or a comma list of seeds") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: no seeds, or a negative one")
    overlap = sorted(set(seeds) & set(EVAL_SEEDS))
    if overlap:
        raise argparse.ArgumentTypeError(
            f"{text!r}: seeds {overlap} are evaluation seeds ({EVAL_SEEDS.start}-"
            f"{EVAL_SEEDS.stop - 1}); train on others (default 100-199)"
        )
    return seeds


def _features(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [n for n in names if n not in FEATURES]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: features must be distinct names from {', '.join(FEATURES)}"
        )
    return names


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not positive")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def parse(argv: list[str] | None = None) -> Args:
    """Typed, range-checked arguments; a bad one exits 2 naming it, before anything runs."""
    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="default outputs/forecast/<exp>.json")
    p.add_argument("--experiment", default="mixed_spike", choices=experiments)
    p.add_argument("--seeds", type=_seeds, default=_seeds("100-199"), help="LO-HI or a,b,c")
    p.add_argument("--features", type=_features, default=FEATURES, help="comma list, key order")
    p.add_argument("--min-count", type=_positive(int), default=100)
    p.add_argument("--prior-weight", type=_positive(float), default=20.0)
    p.add_argument("--policy", default="lru", help="the policy of the training runs (sessions)")
    p.add_argument("--first-fraction", type=_positive(float), default=0.5)
    p.add_argument("--override", dest="overrides", action="append", default=[])
    p.add_argument("--rows-out", type=Path, default=None, help="also save the rows (Parquet)")
    p.add_argument("--rows-in", type=Path, default=None, help="fit from saved rows, no runs")
    ns = p.parse_args(argv)
    if ns.first_fraction > 0.5:
        p.error(f"--first-fraction {ns.first_fraction}: above 0.5 it trains on evaluation data")
    if ns.out is None:
        ns.out = Path("outputs") / "forecast" / f"{ns.experiment}.json"
    if ns.out.is_dir():
        p.error(f"--out {ns.out}: a folder, not a file name")
    if ns.rows_in is not None and not ns.rows_in.is_file():
        p.error(f"--rows-in {ns.rows_in}: no such file")
    return Args(**{k: getattr(ns, k) for k in Args.__dataclass_fields__})


def main(argv: list[str] | None = None) -> int:
    register_configs()
    args = parse(argv)
    try:
        summary = train(args)
    except (ConfigError, ValueError) as err:
        print(f"train-forecast: {err}", file=sys.stderr)
        return 2
    if args.out.resolve() in {p.resolve() for p in shipped_tables()}:
        summary["note"] = "replaced the shipped table (git shows the change)"
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
