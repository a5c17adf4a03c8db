"""How well does each PERC variant predict "resumes within delta"? (a diagnostic, not a test)

Runs mixed_spike with `perc` and `perc_hazard` and, at every eviction decision, records each
candidate's predicted P(resume within delta) next to the truth (the session's true next arrival,
which the simulator knows). Reports the Brier score (lower is better), the base rate, and the
share of ranked pairs whose P order agrees with the truth (AUC).

    python experiments/resume_calibration.py [--seeds 3] [--out experiments/resume_calibration.md]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.perc_variants import PercHazardPolicy
from cachepilot_sim.sim import build

CONF = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"


def auc(p: np.ndarray, truth: np.ndarray) -> float:
    """P(a returning candidate gets a higher P than a non-returning one), ties counted half."""
    pos, neg = p[truth], p[~truth]
    if not pos.size or not neg.size:
        return float("nan")
    ranks = np.argsort(np.argsort(np.concatenate([pos, neg]), kind="stable"), kind="stable") + 1.0
    values = np.concatenate([pos, neg])
    for v in np.unique(values):  # average ranks of ties
        tie = values == v
        ranks[tie] = ranks[tie].mean()
    return float((ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def record(policy: str, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_config(
            compose("config", overrides=["+experiment=mixed_spike", "trace.enabled=false"])
        )
    sim = build(cfg.sim_for(policy, seed))
    pol, est = sim.policy, sim.estimator
    delta = est.delta_us
    preds: list[float] = []
    truth: list[bool] = []
    inner = pol.select_victims

    def spy(entries: Sequence[CacheEntry], need: int, now: int) -> list[CacheEntry]:
        if isinstance(pol, PercHazardPolicy):
            p = pol.probabilities(entries, now)
        else:
            p = np.array([est.resume_probability(e, now) for e in entries])
        for e, pe in zip(entries, p, strict=True):
            preds.append(float(pe))
            truth.append(
                0 <= e.next_arrival_us - now <= delta
                or (e.next_arrival_us >= 0 and e.next_arrival_us < now)
            )
        return inner(entries, need, now)

    pol.select_victims = spy  # type: ignore[method-assign]
    metrics = sim.run().metrics
    return np.array(preds), np.array(truth), metrics["realized_restore_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    register_configs()
    rows = [
        "| policy | candidates scored | base rate | mean P | Brier | AUC | realized restore s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for policy in ("perc", "perc_hazard"):
        runs = [record(policy, seed) for seed in range(args.seeds)]
        p = np.concatenate([r[0] for r in runs])
        t = np.concatenate([r[1] for r in runs])
        rows.append(
            f"| {policy} | {p.size} | {t.mean():.3f} | {p.mean():.3f} | "
            f"{np.mean((p - t) ** 2):.3f} | {auc(p, t):.3f} | "
            f"{np.mean([r[2] for r in runs]):.2f} |"
        )
        print(rows[-1], flush=True)
    head = (
        f"# Resume-probability calibration (mixed_spike, seeds 0-{args.seeds - 1})\n\n"
        f"Command: `python experiments/resume_calibration.py --seeds {args.seeds} "
        "--out experiments/resume_calibration.md`\n\n"
    )
    if args.out:
        args.out.write_text(head + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
