"""The plan's answer: the cheapest configuration meeting the SLA, the Pareto front of cost against
TTFT p99, and every rejected configuration with the SLA term it missed and by how much."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cachepilot_sim.config import Objective
from cachepilot_sim.plan.config import GpuPrice, PlanConfig
from cachepilot_sim.plan.search import CellResult, Evaluation

APPROXIMATION = (
    "Replicas are simulated together on one clock behind the router (cachepilot_sim/cluster); "
    "each GPU's step-time basis is listed below (the default engine scales the H200 "
    "calibration by datasheet ratios, a fitted or physical engine does not), and every TP "
    "all-reduce is derived, not measured."
)


def cost_per_hour(e: Evaluation, prices: dict[str, GpuPrice]) -> float:
    return e.num_gpus * prices[e.cell.gpu].usd_per_gpu_hour


def _row(e: Evaluation, prices: dict[str, GpuPrice]) -> dict[str, Any]:
    return {
        "config": e.cell.label(),
        "scale": e.scale,
        "gpus": e.num_gpus,
        "usd_per_hour": round(cost_per_hour(e, prices), 6),
        "ttft_p99_s": e.ttft_p99_s,
        "tpot_p99_ms": e.tpot_p99_ms,
        "goodput_fraction": e.goodput_fraction,
    }


def _why(e: Evaluation) -> str:
    parts = []
    for term, m in e.misses.items():
        over = m["value"] - m["limit"]
        rel = f" ({over / m['limit']:+.0%})" if m["limit"] and math.isfinite(m["value"]) else ""
        parts.append(f"{term} {m['value']:.4g} vs {m['limit']:g}{rel}")
    return "; ".join(parts)


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows not dominated in (cost, TTFT p99): cheapest first, each faster than every cheaper."""
    front: list[dict[str, Any]] = []
    best = math.inf
    for r in sorted(rows, key=lambda r: (r["usd_per_hour"], r["ttft_p99_s"], r["config"])):
        if r["ttft_p99_s"] < best:
            front.append(r)
            best = r["ttft_p99_s"]
    return front


def question_of(plan: PlanConfig, run: Any) -> list[str]:
    """What the plan simulates, in words (plan.md's and the screen's first lines), from the
    RunConfig of its first cell: traffic, model, SLA, objective; a plan that replays a slice of
    its trace or a compressed clock says that it does not answer the trace as recorded."""
    from cachepilot_sim.config import TraceFormat
    from cachepilot_sim.config.question import traffic

    sla = plan.sla
    lines = [
        f"Simulated: {traffic(run)}.",
        f"Model: {run.model.name}; each replica a whole GPU of the search space.",
        f"SLA (all three must hold over the whole run): TTFT p99 <= {sla.ttft_p99_s:g} s, TPOT "
        f"p99 <= {sla.tpot_p99_ms:g} ms, and at least {sla.goodput_fraction:.0%} of requests "
        f"within their own SLOs (TTFT <= {run.replay.ttft_slo_ms:g} ms, TPOT <= "
        f"{run.replay.tpot_slo_ms:g} ms).",
        f"Ranked on: {plan.objective} (objective=cost|ttft_p99|goodput).",
    ]
    rc = run.replay
    if rc.format != TraceFormat.NONE and (rc.limit or rc.time_scale != 1):
        lines.insert(
            0,
            "NOTE: this plan does not answer the trace as recorded: it simulates "
            + (f"only its first {rc.limit:,} requests" if rc.limit else "every request")
            + (f", replayed {1 / rc.time_scale:g}x faster" if rc.time_scale < 1 else "")
            + (f", replayed {rc.time_scale:g}x slower" if rc.time_scale > 1 else "")
            + ".",
        )
    return lines


RANK_KEYS = {
    Objective.cost: lambda r: (r["usd_per_hour"], r["ttft_p99_s"], r["config"]),
    Objective.ttft_p99: lambda r: (r["ttft_p99_s"], r["usd_per_hour"], r["config"]),
    Objective.goodput: lambda r: (-r["goodput_fraction"], r["usd_per_hour"], r["config"]),
}


def build_answer(
    plan: PlanConfig,
    results: list[CellResult],
    prices: dict[str, GpuPrice],
    question: list[str] | None = None,
) -> dict[str, Any]:
    """Everything plan.json holds (no wall-clock figures: a rerun writes the same bytes)."""
    evals = [e for r in results for e in r.evaluations]
    feasible = [_row(e, prices) for e in evals if e.meets]
    feasible.sort(key=RANK_KEYS[Objective.cost])
    best = min(feasible, key=RANK_KEYS[plan.objective]) if feasible else None
    rejected = [_row(e, prices) | {"why": _why(e)} for e in evals if not e.meets]
    pruned = []
    for r in results:
        misses = [e.scale for e in r.evaluations if not e.meets]
        if misses and max(misses) > 1:
            top = max(misses)
            pruned.append(
                {"config": r.cell.label(), "scales": f"1..{top - 1}", "why": f"{top} missed"}
            )
    refused = [{"config": r.cell.label(), "why": r.refused} for r in results if r.refused]
    grid = len(results) * plan.space.max_replicas
    return {
        "plan": plan.name,
        "question": question or [],
        "objective": str(plan.objective),
        "best": best,
        "sla": asdict(plan.sla),
        "approximation": APPROXIMATION,
        "cheapest": feasible[0] if feasible else None,
        "pareto": pareto_front(feasible),
        "feasible": feasible,
        "rejected": rejected,
        "pruned_by_monotonicity": pruned,
        "refused": refused,
        "num_cells": len(results),
        "num_simulated": len(evals),
        "grid_size": grid,
        "hardware": sorted({e.hardware_profile for e in evals if e.hardware_profile}),
        # One engine label per engine x GPU simulated: how far each answer can be trusted.
        "trust": sorted({e.trust for e in evals if e.trust}),
        "prices": {g: asdict(p) for g, p in sorted(prices.items())},
    }


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    fmt = {float: lambda v: f"{v:.4g}"}
    body = "".join(
        "| " + " | ".join(fmt.get(type(r[c]), str)(r[c]) for c in cols) + " |\n" for r in rows
    )
    return head + body


def markdown(answer: dict[str, Any]) -> str:
    """plan.md: the answer first, then the front, then every rejection with its reason."""
    sla = answer["sla"]
    lines = [f"# Capacity plan: {answer['plan']}\n"]
    lines += [f"{line}  " for line in answer.get("question", [])]
    lines += [
        "",
        f"SLA: TTFT p99 <= {sla['ttft_p99_s']:g} s, TPOT p99 <= {sla['tpot_p99_ms']:g} ms, "
        f"goodput >= {sla['goodput_fraction']:.0%} of requests within their SLOs.\n",
    ]
    trust = answer.get("trust") or ["not recorded"]
    lines += [f"Trust: {t}" for t in trust] + [""]
    best = answer["cheapest"]
    if best is None:
        lines.append("**No configuration in the search space meets the SLA.**\n")
    else:
        lines.append(
            f"**Cheapest: {best['config']} x {best['scale']} ({best['gpus']} GPUs), "
            f"${best['usd_per_hour']:.2f}/hour**: TTFT p99 {best['ttft_p99_s']:.3f} s, TPOT p99 "
            f"{best['tpot_p99_ms']:.1f} ms, goodput {best['goodput_fraction']:.1%}.\n"
        )
    top = answer.get("best")
    if top is not None and answer.get("objective", "cost") != "cost":
        lines.append(
            f"**Best on {answer['objective']}: {top['config']} x {top['scale']} ({top['gpus']} "
            f"GPUs), ${top['usd_per_hour']:.2f}/hour**: TTFT p99 {top['ttft_p99_s']:.3f} s, "
            f"goodput {top['goodput_fraction']:.1%}.\n"
        )
    lines.append(
        f"{answer['num_simulated']} configurations simulated over {answer['num_cells']} cells "
        f"(a full grid up to the replica cap: {answer['grid_size']}). {answer['approximation']}\n"
    )
    for h in answer["hardware"]:
        lines.append(f"- {h}")
    cols = ["config", "scale", "gpus", "usd_per_hour", "ttft_p99_s", "tpot_p99_ms"]
    lines += ["\n## Pareto front (cost vs TTFT p99)\n", _table(answer["pareto"], cols)]
    lines += ["![pareto](pareto.png)\n", "## Rejected (simulated, missed the SLA)\n"]
    lines.append(_table(answer["rejected"], [*cols[:4], "why"]))
    if answer["pruned_by_monotonicity"]:
        lines += ["## Not simulated: fewer replicas than a scale that missed\n"]
        lines.append(_table(answer["pruned_by_monotonicity"], ["config", "scales", "why"]))
    if answer["refused"]:
        lines += ["## Refused configurations\n", _table(answer["refused"], ["config", "why"])]
    lines += ["## Prices\n"]
    lines += [
        f"- {g}: ${p['usd_per_gpu_hour']}/GPU-hour, {p['source']} ({p['date']})"
        for g, p in answer["prices"].items()
    ]
    return "\n".join(lines) + "\n"


def pareto_label(row: dict[str, Any]) -> str:
    """A front point's label: `mi300x tp1 1:1 x1 (2 GPUs)` (GPU, TP, split, scale, GPUs)."""
    words = row["config"].split()
    return f"{words[0]} {words[1]} {words[-1]} x{row['scale']} ({row['gpus']} GPUs)"


def figure(answer: dict[str, Any], path: Path) -> None:
    """pareto.png: every feasible configuration, cost against TTFT p99, the front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import polars as pl
    import seaborn as sns

    from cachepilot_sim.plotting import seaborn_data

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if answer["feasible"]:
        frame = pl.DataFrame(answer["feasible"]).with_columns(
            pl.col("config").str.split(" ").list.first().alias("gpu")
        )
        data = seaborn_data(frame.select("usd_per_hour", "ttft_p99_s", "gpu"))
        sns.scatterplot(data=data, x="usd_per_hour", y="ttft_p99_s", hue="gpu", ax=ax)
        front = answer["pareto"]
        ax.plot([r["usd_per_hour"] for r in front], [r["ttft_p99_s"] for r in front], "k--", lw=1)
        for r in front:  # each point of the front named: which configuration, how many GPUs
            ax.annotate(
                pareto_label(r),
                (r["usd_per_hour"], r["ttft_p99_s"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
    ax.axhline(answer["sla"]["ttft_p99_s"], color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="cost (USD per hour)", ylabel="TTFT p99 (s)", title=f"{answer['plan']}: Pareto front"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity (no request completed) as None, for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write(answer: dict[str, Any], out_dir: Path) -> None:
    """plan.json, plan.md and pareto.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(answer), indent=1, allow_nan=False, default=str)
    (out_dir / "plan.json").write_text(text + "\n")
    (out_dir / "plan.md").write_text(markdown(answer))
    figure(answer, out_dir / "pareto.png")
