"""How tight is the offline LP bound? The integral (0/1) offline optimum of the same sequence.

For a few (policy, seed) runs of mixed_spike: realized restore seconds, the LP lower bound and the
0/1 optimum over the run's own access sequence (HiGHS, time-limited). A one-off measurement: the
MILP takes 10-30 s per run on one core, too slow for every cell of the shootout.

    python experiments/offline_opt.py --out experiments/offline_opt.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.offline import access_sequence, integral_optimum, lp_lower_bound
from cachepilot_sim.sim import build

CONF = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
RUNS = (("perc", 0), ("lru", 0), ("perc_clairvoyant", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--time-limit-s", type=float, default=120.0)
    args = parser.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run_cfg = to_config(
            compose("config", overrides=["+experiment=mixed_spike", "trace.enabled=false"])
        )
    rows = [
        "| policy | seed | realized restore s | LP bound s | 0/1 optimum s | proven bound s "
        "| LP / optimum | MILP wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, seed in RUNS:
        cfg = run_cfg.sim_for(policy, seed)
        result = build(cfg).run()
        seq = access_sequence(cfg, result.requests)
        lp = lp_lower_bound(seq)
        start = time.perf_counter()
        opt = integral_optimum(seq, args.time_limit_s)
        wall = time.perf_counter() - start
        rows.append(
            f"| {policy} | {seed} | {result.metrics['realized_restore_s']:.3f} | "
            f"{lp.restore_us / 1e6:.3f} | {opt.restore_us / 1e6:.3f} | "
            f"{opt.bound_us / 1e6:.3f} | {lp.restore_us / opt.restore_us:.4f} | "
            f"{wall:.0f} |"
        )
        print(rows[-1], flush=True)
    head = (
        "# Offline LP bound vs the 0/1 offline optimum (mixed_spike)\n\n"
        "Command: `python experiments/offline_opt.py --out experiments/offline_opt.md`\n\n"
    )
    if args.out:
        args.out.write_text(head + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
