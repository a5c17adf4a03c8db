"""Train the learned admission controller: imitate a tuned threshold rule, then REINFORCE.

    python -m cachepilot_sim.tools.train_admission --out NEW.npz [--seed 0]

`--out` is required and may not be a shipped weights file (experiments/admission/*.npz, which
`admission=learned` loads); every argument is range-checked by argparse before anything runs.

1. Teacher: the threshold rule's two parameters picked by a small grid on the training seeds (best
   mean goodput). 2. Imitation: cross-entropy of the MLP against the teacher's decisions, recorded
   on the training seeds. 3. REINFORCE: per iteration, `--episodes` runs of one training seed with
   sampled actions; advantage = episode goodput under SLA minus the batch mean, over its std (common
   random numbers: the workload is the same, only the admission actions differ). The greedy policy
   is scored on the training seeds every `--eval-every` iterations and the best one is saved.
Everything is seeded by `--seed`; the weights are a plain .npz with a .json feature spec beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.admission import AdmissionController, AdmissionView, Decision, features
from cachepilot_sim.admission.controllers import Learned, Threshold, allowed
from cachepilot_sim.admission.mlp import Mlp
from cachepilot_sim.config import SimConfig, admission_config, register_configs, to_config
from cachepilot_sim.sim import build
from cachepilot_sim.tools import CONF_DIR

# Weights the repository ships (conf/admission/*.yaml load them): never a training output.
SHIPPED_WEIGHTS = tuple(
    (Path(__file__).resolve().parents[2] / "experiments" / "admission").glob("*.npz")
)

# The overloaded variant of mixed_spike the controller is trained for: 256 front-end slots and a
# x16 spike, so that queues and KV pressure actually build (stock mixed_spike rarely needs a gate).
OVERLOAD = ["workload.max_active_sessions=256", "workload.spike_multiplier=16"]
GRID_LOAD = (0.6, 0.75, 0.9)
GRID_QUEUE = (4, 8, 16, 32)
Row = tuple[np.ndarray, int, np.ndarray]


def base_config(overrides: list[str], experiment: str = "mixed_spike") -> SimConfig:
    """`experiment` (no event trace) with `overrides`, as one SimConfig (seed 0, PERC)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_config(
            compose(
                "config", overrides=[f"+experiment={experiment}", "trace.enabled=false", *overrides]
            )
        )
    return cfg.sim_for(cfg.policy.name, cfg.seed)


def with_admission(cfg: SimConfig, seed: int, **admission: Any) -> SimConfig:
    values = {"name": "threshold", **admission}
    return replace(cfg, seed=seed, admission=admission_config(**values))


class Recording:
    """Wraps a controller and records (features, decision, allowed mask) of every decision."""

    def __init__(self, inner: AdmissionController) -> None:
        self.inner = inner
        self.rows: list[Row] = []

    def decide(self, view: AdmissionView) -> Decision:
        d = self.inner.decide(view)
        self.rows.append((features(view), int(d), allowed(view)))
        return d


def run_episode(cfg: SimConfig, controller: AdmissionController | None = None) -> dict[str, Any]:
    """One simulation; `controller` replaces the gate's (cfg.admission must build a gate)."""
    sim = build(cfg)
    if controller is not None:
        assert sim.batcher.gate is not None
        sim.batcher.gate.controller = controller
    return sim.run().metrics


def score(metrics: list[dict[str, Any]]) -> float:
    return float(np.mean([m["goodput_req_s"] for m in metrics]))


def tune_teacher(cfg: SimConfig, seeds: list[int]) -> tuple[float, int, float]:
    """(load_fraction, queue_depth, mean goodput) of the best threshold rule on `seeds`."""
    best = (1.0, 0, -1.0)
    for load in GRID_LOAD:
        for depth in GRID_QUEUE:
            kw = {"threshold_load_fraction": load, "threshold_queue_depth": depth}
            g = score([run_episode(with_admission(cfg, s, **kw)) for s in seeds])
            if g > best[2]:
                best = (load, depth, g)
    return best


# Not torch.optim.Adam: the gradients are NumPy arrays of the NumPy MLP the simulator runs without
# torch (torch is a dev-only dependency); porting the training to torch is larger than this class.
class Adam:
    def __init__(self, params: list[np.ndarray], lr: float) -> None:
        self.params, self.lr, self.t = params, lr, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            p -= self.lr * (m / (1 - 0.9**self.t)) / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)


def stack(rows: list[Row]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]),
    )


def imitate(mlp: Mlp, rows: list[Row], epochs: int, lr: float, rng: np.random.Generator) -> list:
    """Minibatch cross-entropy against the teacher's decisions; returns the loss per epoch."""
    if not rows:  # the teacher never saw pressure: nothing to imitate
        return []
    x, a, mask = stack(rows)
    opt, losses = Adam(mlp.params(), lr), []
    for _ in range(epochs):
        order, total = rng.permutation(len(a)), 0.0
        for start in range(0, len(a), 64):
            b = order[start : start + 64]
            loss, grads = mlp.loss_and_grads(x[b], a[b], np.full(b.size, 1.0 / b.size), mask[b])
            opt.step(grads)
            total += loss * b.size
        losses.append(total / len(a))
    return losses


@dataclass
class Args:
    out: Path
    seed: int
    train_seeds: int
    episode_requests: int
    imitation_epochs: int
    iterations: int
    episodes: int
    eval_every: int
    hidden: int
    lr: float
    experiment: str = "mixed_spike"
    overrides: list[str] | None = None  # None: OVERLOAD


def train(args: Args) -> dict[str, Any]:
    """Teacher, imitation, REINFORCE; writes the weights and returns the training log."""
    rng = np.random.default_rng(np.random.SeedSequence(args.seed))
    overrides = OVERLOAD if args.overrides is None else args.overrides
    cfg = base_config(
        [*overrides, f"workload.num_requests={args.episode_requests}"], args.experiment
    )
    seeds = list(range(args.seed + 1000, args.seed + 1000 + args.train_seeds))
    load, depth, teacher_goodput = tune_teacher(cfg, seeds)
    kw = {"threshold_load_fraction": load, "threshold_queue_depth": depth}
    rows: list[Row] = []
    for s in seeds:
        rec = Recording(Threshold(load, depth))
        run_episode(with_admission(cfg, s, **kw), rec)
        rows += rec.rows
    sim = build(with_admission(cfg, seeds[0]))
    assert sim.batcher.gate is not None
    names = sim.batcher.gate.feature_names
    mlp = Mlp.init(names, args.hidden, rng)
    losses = imitate(mlp, rows, args.imitation_epochs, args.lr, rng)

    def greedy_score() -> float:
        return score([run_episode(with_admission(cfg, s), Learned(mlp)) for s in seeds])

    best = (greedy_score(), [p.copy() for p in mlp.params()], 0)
    log: dict[str, Any] = {
        "teacher": {**kw, "goodput_req_s": teacher_goodput},
        "imitation_loss": losses,
        "num_imitation_rows": len(rows),
        "rl_mean_goodput": [],
        "greedy": [[0, best[0]]],
    }
    opt = Adam(mlp.params(), args.lr * 0.3)
    for it in range(1, args.iterations + 1):
        s = seeds[it % len(seeds)]
        returns, logs = [], []
        for _ in range(args.episodes):
            agent = Learned(mlp, np.random.default_rng(rng.integers(2**63)))
            returns.append(run_episode(with_admission(cfg, s), agent)["goodput_req_s"])
            logs.append(agent.log)
        r = np.array(returns)
        adv = (r - r.mean()) / (r.std() + 1e-9)
        batch = [row for lg in logs for row in lg]
        if batch:
            w = np.concatenate([np.full(len(lg), a) for lg, a in zip(logs, adv, strict=True)])
            x, acts, mask = stack(batch)
            _, grads = mlp.loss_and_grads(x, acts, w / len(batch), mask)
            opt.step(grads)
        log["rl_mean_goodput"].append(float(r.mean()))
        if it % args.eval_every == 0:
            g = greedy_score()
            log["greedy"].append([it, g])
            if g > best[0]:
                best = (g, [p.copy() for p in mlp.params()], it)
    mlp.w1, mlp.b1, mlp.w2, mlp.b2 = best[1]
    log["best_iteration"], log["best_greedy_goodput"] = best[2], best[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    mlp.save(args.out)
    args.out.with_name(args.out.stem + "_train_log.json").write_text(json.dumps(log, indent=1))
    return log


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse_int(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse_int.__name__ = f"integer >= {low}"
    return parse_int


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a finite positive number")
    return value


def _weights_out(text: str) -> Path:
    """A new .npz path: not a folder, not the shipped weights (admission=learned loads those)."""
    path = Path(text)
    if path.suffix != ".npz" or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a .npz file name")
    if path.resolve() in {w.resolve() for w in SHIPPED_WEIGHTS}:
        raise argparse.ArgumentTypeError(
            f"{text}: these are the shipped weights that admission=learned loads; write to "
            "another file and replace them deliberately (git shows the change)"
        )
    base = path.parent
    while not base.exists() and base != base.parent:  # folders to be created: check the first
        base = base.parent  # one that exists
    if not base.is_dir() or not os.access(base, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: {base} is not a writable folder")
    return path


def parse(argv: list[str] | None = None) -> Args:
    """Every argument typed and range-checked by argparse: a bad one exits 2 naming it, before
    any training or writing."""
    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=_weights_out, required=True, help="new .npz file")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--train-seeds", type=_int_at_least(1), default=3)
    p.add_argument("--episode-requests", type=_int_at_least(1), default=1000)
    p.add_argument("--imitation-epochs", type=_int_at_least(0), default=60)
    p.add_argument("--iterations", type=_int_at_least(1), default=30)
    # REINFORCE's advantage divides by the std over the batch: at least two episodes.
    p.add_argument("--episodes", type=_int_at_least(2), default=6)
    p.add_argument("--eval-every", type=_int_at_least(1), default=5)
    p.add_argument("--hidden", type=_int_at_least(1), default=16)
    p.add_argument("--lr", type=_rate, default=0.01)
    p.add_argument(
        "--experiment",
        default="mixed_spike",
        choices=experiments,
        help="cachepilot_sim/conf/experiment/<name>.yaml",
    )
    p.add_argument(
        "--override",
        dest="overrides",
        action="append",
        default=None,
        help="a Hydra override of the training scenario (repeatable); default: the "
        "overloaded mixed_spike (" + " ".join(OVERLOAD) + ")",
    )
    ns = p.parse_args(argv)
    return Args(**{k: getattr(ns, k) for k in Args.__dataclass_fields__})


def main(argv: list[str] | None = None) -> None:
    register_configs()
    log = train(parse(argv))
    print(
        json.dumps(
            {k: v for k, v in log.items() if k not in ("imitation_loss", "rl_mean_goodput")},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
