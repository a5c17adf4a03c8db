"""Capacity planner: the cheapest configuration whose simulated serving meets an SLA.

    cachepilot-sim plan [--config cachepilot_sim/conf/plan/azure_conv.yaml] [--out plan_out]
        [key=value ...]   (plan config overrides, e.g. sla.ttft_p99_s=1 space.gpus=[h200,l40s];
                           objective=cost|ttft_p99|goodput ranks the configurations meeting the SLA)

The default plan (conf/plan/azure_conv.yaml) is the Azure conversation trace as recorded; plan.md
and the screen open with what is simulated and say when a plan replays a slice or a compressed
clock (conf/plan/azure_conv_first1000_x10.yaml: its first 1,000 requests 10x faster).

For every combination of the search space (GPU type, TP, policy, router, batcher, CPU offload size,
P/D split) the fewest replicas meeting the SLA are found by binary search (a scale that misses
rules out every smaller one), cells in parallel (joblib; `launcher=ray` for a Ray cluster). Writes
plan.md, plan.json and pareto.png: the cheapest configuration, the Pareto front of cost against
TTFT p99, and every rejected configuration with the SLA term it missed. Prices per GPU-hour:
cachepilot_sim/conf/plan/prices.yaml (source and date of each). Exit status 2 on a bad plan,
naming the key; nothing is written then.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from rich.console import Console

from cachepilot_sim.config import ConfigError
from cachepilot_sim.entry import entry_point
from cachepilot_sim.outputs import check_folder, staged_folder
from cachepilot_sim.plan import Cell, PlanConfig, build_answer, cells_of, load_plan, run_search
from cachepilot_sim.plan.config import Launcher, load_prices
from cachepilot_sim.plan.report import markdown, question_of, write
from cachepilot_sim.plan.search import compose_run
from cachepilot_sim.tools import CONF_DIR

DEFAULT_PLAN = CONF_DIR / "plan" / "azure_conv.yaml"
PLAN_OUTPUTS = ("plan.json", "plan.md", "pareto.png")  # what a rerun replaces in --out


def _question(plan: PlanConfig, cells: list[Cell]) -> list[str]:
    """The plan's question in words (plan/report.py question_of), from its first cell that
    composes (a refused cell, a model too big for its GPU, is the search's to report)."""
    for cell in cells:
        try:
            return question_of(plan, compose_run(plan, cell, 1))
        except ConfigError:
            continue
    return []


@entry_point("cachepilot-sim plan")
def main(argv: list[str] | None = None) -> int:
    """Run the plan; 0 with an answer (even "nothing meets the SLA"), 2 on bad input, 128 + the
    signal when stopped (SIGINT, SIGTERM, SIGHUP: the workers are stopped, nothing written)."""
    ap = argparse.ArgumentParser(
        prog="cachepilot-sim plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", default=str(DEFAULT_PLAN), help="plan YAML (conf/plan/)")
    ap.add_argument("--out", default="plan_out", help="folder for plan.md, plan.json, pareto.png")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the plan config")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    out = Path(args.out)
    plan = load_plan(Path(args.config), list(args.overrides))
    prices = load_prices(plan)
    check_launcher(plan)
    check_folder(out)  # before the search, not after it
    cells = cells_of(plan)
    question = _question(plan, cells)
    for line in question:  # what is simulated, before the search starts
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    t0 = time.perf_counter()  # wall time, printed only: plan.json stays rerun-identical
    results = run_search(plan, cells)
    if all(r.refused for r in results):
        raise ConfigError(f"every configuration was refused; first: {results[0].refused}")
    wall = time.perf_counter() - t0
    answer = build_answer(plan, results, prices, question)
    with staged_folder(out, PLAN_OUTPUTS) as stage:  # an earlier plan stays until this one is whole
        write(answer, stage)
    console.print(markdown(answer).split("\n## ")[0], markup=False, highlight=False)
    console.print(
        f"{answer['num_simulated']} configurations simulated in {wall:.1f} s; results: {out}",
        markup=False,
    )
    return 0


def check_launcher(plan: PlanConfig) -> None:
    """launcher=ray needs Ray, an optional extra: refused before anything runs when absent."""
    if plan.launcher == Launcher.RAY and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "config key 'launcher' = 'ray': Ray is not installed (pip install "
            "'cachepilot-sim[plan-ray]'), or use launcher=joblib"
        )


if __name__ == "__main__":
    sys.exit(main())
