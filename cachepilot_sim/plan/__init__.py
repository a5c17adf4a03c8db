"""Capacity planning: the cheapest cluster (GPU type, count, TP, router, policy, ...) whose
simulated serving of a workload meets an SLA, found by a monotone search over replica counts
(`search.py`), with the Pareto front of cost against TTFT p99 (`report.py`).
`cachepilot-sim plan` (tools/plan.py) runs it."""

from cachepilot_sim.plan.config import GpuPrice, PlanConfig, SearchSpace, SlaConfig, load_plan
from cachepilot_sim.plan.report import build_answer, pareto_front
from cachepilot_sim.plan.search import Cell, CellResult, Evaluation, cells_of, run_search

__all__ = [
    "Cell",
    "CellResult",
    "Evaluation",
    "GpuPrice",
    "PlanConfig",
    "SearchSpace",
    "SlaConfig",
    "build_answer",
    "cells_of",
    "load_plan",
    "pareto_front",
    "run_search",
]
