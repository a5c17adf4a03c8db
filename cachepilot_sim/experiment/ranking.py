"""Which policy, on the metric asked: policies ranked on the run's `objective` (TTFT p99 unless
another is asked), each with its paired difference to the baseline on the same seed and that
difference's 95 % t interval, plus the warnings that say when the ranking means little.

Two warnings. *Within noise*: no policy's difference to the baseline is outside its interval (or,
under three seeds, every policy is within NOISE_FRACTION of it); *saturated* when, besides, the GPU
computed almost all the time (SATURATED_GPU_BUSY: requests queue for compute) or the KV pool was
nearly full on average (SATURATED_KV_UTIL: nothing idle was left to choose among).
And one short cut: when the baseline's cells evicted nothing (typically a trace without reuse, such
as the Azure traces, which carry no sessions and no prefix hashes), no policy was ever asked to
choose, so the runner runs the baseline alone and lists the other policies as identical by
construction, with the reason (`cannot_differ`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cachepilot_sim.config import Objective
from cachepilot_sim.experiment.intervals import MIN_SEEDS, Interval, nonnegative_interval
from cachepilot_sim.experiment.intervals import t_interval as t_interval_of

NOISE_FRACTION = 0.01  # under MIN_SEEDS seeds: policies this close to the baseline are "same"
SATURATED_KV_UTIL = 0.9  # mean KV pool occupancy above which little idle KV is left to evict
SATURATED_GPU_BUSY = 0.95  # share of the run the GPU computed: above it, requests queue for compute


@dataclass(frozen=True, slots=True)
class ObjectiveSpec:
    """How one objective reads off a cell: its label, unit, direction and number format."""

    label: str
    unit: str
    higher_is_better: bool
    fmt: str


SPECS: dict[Objective, ObjectiveSpec] = {
    Objective.ttft_p99: ObjectiveSpec("TTFT p99", "ms", False, "ms"),
    Objective.e2e_p99: ObjectiveSpec("E2E p99", "ms", False, "ms"),
    Objective.goodput: ObjectiveSpec("goodput", "req/s", True, "{:.4f}"),
    Objective.restore_s: ObjectiveSpec("restore", "s", False, "{:.3f}"),
    Objective.cost: ObjectiveSpec("cost", "GPU-s per completed request", False, "{:.4g}"),
}


def objective_value(
    objective: Objective, cell: dict[str, Any], serving: dict[str, float], num_gpus: int
) -> float:
    """One cell's value of `objective` (NaN where it has none)."""
    if objective == Objective.ttft_p99:
        return float(serving.get("ttft_p99_ms", math.nan))
    if objective == Objective.e2e_p99:
        return float(serving.get("e2e_p99_ms", math.nan))
    if objective == Objective.goodput:
        return float(cell.get("goodput_req_s", math.nan))
    if objective == Objective.restore_s:
        return float(cell.get("realized_restore_s", math.nan))
    completed = float(cell.get("completed", 0) or 0)
    return cell["duration_s"] * num_gpus / completed if completed else math.nan


@dataclass(frozen=True, slots=True)
class RankedRow:
    """One policy on the objective: its mean (with a non-negative interval), its paired
    difference to the baseline (policy - baseline, same seed), and that as a fraction of the
    baseline's mean."""

    policy: str
    value: Interval
    diff: Interval
    relative: float

    def differs(self) -> bool | None:
        """Whether the difference's interval excludes 0 (None: no interval)."""
        if not self.diff.known:
            return None
        return self.diff.low > 0 or self.diff.high < 0


@dataclass(slots=True)
class Ranking:
    """Policies best first on `objective`, the warnings, and the policies not run (identical by
    construction, with the reason)."""

    objective: Objective
    baseline: str
    rows: list[RankedRow]
    warnings: list[str] = field(default_factory=list)
    identical: list[str] = field(default_factory=list)
    identical_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        spec = SPECS[self.objective]
        return {
            "objective": str(self.objective),
            "unit": spec.unit,
            "higher_is_better": spec.higher_is_better,
            "baseline": self.baseline,
            "rows": [
                {
                    "policy": r.policy,
                    "mean": r.value.mean,
                    "ci95": [r.value.low, r.value.high],
                    "diff_vs_baseline": r.diff.mean,
                    "diff_ci95": [r.diff.low, r.diff.high],
                    "relative": r.relative,
                    "num_seeds": r.value.n,
                }
                for r in self.rows
            ],
            "warnings": self.warnings,
            "identical_by_construction": self.identical,
            "identical_reason": self.identical_reason,
        }


def rank(
    cells: Sequence[dict[str, Any]],
    serving: Sequence[dict[str, float]],
    baseline: str,
    objective: Objective,
    num_gpus: int = 1,
) -> Ranking:
    """Every policy of `cells` ranked on `objective` (`serving[i]` belongs to `cells[i]`)."""
    spec = SPECS[objective]
    values = [
        objective_value(objective, c, serving[i] if serving else {}, num_gpus)
        for i, c in enumerate(cells)
    ]
    base = {c["seed"]: values[i] for i, c in enumerate(cells) if c["policy"] == baseline}
    base_mean = nonnegative_interval(list(base.values())).mean if base else math.nan
    rows = []
    for policy in dict.fromkeys(c["policy"] for c in cells):
        own = [(c["seed"], values[i]) for i, c in enumerate(cells) if c["policy"] == policy]
        diffs = [v - base[s] for s, v in own if s in base]
        diff = t_interval_of(diffs)
        rel = diff.mean / base_mean if base_mean and math.isfinite(base_mean) else math.nan
        rows.append(RankedRow(policy, nonnegative_interval([v for _, v in own]), diff, rel))
    sign = -1.0 if spec.higher_is_better else 1.0
    rows.sort(key=lambda r: (math.isnan(r.value.mean), sign * r.value.mean, r.policy))
    ranking = Ranking(objective, baseline, rows)
    ranking.warnings = warnings_for(ranking, cells)
    return ranking


def warnings_for(ranking: Ranking, cells: Sequence[dict[str, Any]]) -> list[str]:
    """Within-noise, saturated and nothing-evicted warnings (see the module docstring)."""
    label = SPECS[ranking.objective].label
    others = [r for r in ranking.rows if r.policy != ranking.baseline]
    out: list[str] = []
    if not others:
        return out
    verdicts = [r.differs() for r in others]
    if all(v is None for v in verdicts):
        close = all(abs(r.relative) < NOISE_FRACTION for r in others if math.isfinite(r.relative))
        noise = close and any(math.isfinite(r.relative) for r in others)
        n = others[0].diff.n
        why = f"with {n} seed{'s' if n != 1 else ''}, under {MIN_SEEDS}, no interval separates them"
        if noise:
            out.append(
                f"every policy is within {NOISE_FRACTION:.0%} of {ranking.baseline} on "
                f"{label} and {why}: treat them as equal"
            )
        else:
            out.append(f"{why}; run seeds={MIN_SEEDS} or more before choosing on {label}")
    else:
        noise = not any(v for v in verdicts)
        if noise:
            out.append(
                f"no policy differs from {ranking.baseline} on {label} beyond seed noise "
                "(every 95 % interval of the difference contains 0)"
            )
    if noise and (why := saturation(cells)):
        out.append(
            f"saturated: {why}, so the policy barely matters at this load; the levers are load, "
            "memory and GPUs (cachepilot-sim plan)"
        )
    if all(float(c.get("evictions", 0) or 0) == 0 for c in cells):
        out.append("no cell evicted anything: the policies never had a choice to make")
    return out


def saturation(cells: Sequence[dict[str, Any]]) -> str:
    """What saturated every cell, in words ("" when none was): a GPU computing almost all the
    time (requests queue for compute whatever stays cached) or a KV pool full on average (little
    idle KV for any policy to choose from)."""
    busy = [float(c["gpu_busy_frac"]) for c in cells if "gpu_busy_frac" in c]
    util = [float(c["vram_kv_util_mean"]) for c in cells if "vram_kv_util_mean" in c]
    parts = []
    if busy and min(busy) >= SATURATED_GPU_BUSY:
        parts.append(f"the GPU computed {min(busy):.0%} or more of the time in every cell")
    if util and min(util) >= SATURATED_KV_UTIL:
        parts.append(
            f"the KV pool was {min(util):.0%} or more full on average, leaving little idle KV "
            "to choose from"
        )
    return " and ".join(parts)


def cannot_differ(cells: Sequence[dict[str, Any]]) -> str:
    """Why no other eviction policy can change these (baseline) cells' results, "" when one can.

    An eviction policy acts only when the KV manager needs a victim (EvictionPolicy.key and
    select_victims); its hooks keep its own state and change nothing else. A run that evicted
    nothing (no eviction, no prefix-cap eviction, no CPU drop) never asked, so every policy runs
    the same steps. Whether the trace has reuse is said beside it (returning turns, prefix
    lookups), since that is the usual reason."""
    if not cells:
        return ""
    for c in cells:
        if "evictions" not in c:  # a cell without the counts says nothing
            return ""
        asked = sum(int(c.get(k, 0) or 0) for k in ("evictions", "prefix_cap_evictions",
                                                   "cpu_drops"))  # fmt: skip
        if asked:
            return ""
    returning = sum(
        int(c.get(k, 0) or 0)
        for c in cells
        for k in ("turns_hit", "turns_reload", "turns_recompute", "prefix_hit_blocks")
    )
    reuse = (
        "the trace has no reuse (0 returning turns, 0 prefix-cache hits) and "
        if returning == 0
        else ""
    )
    return (
        f"{reuse}the baseline evicted nothing in {len(cells)} cell{'s' if len(cells) > 1 else ''}, "
        "so no eviction policy was ever asked to choose and every policy runs the same steps"
    )


def ranking_cells(ranking: Ranking) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows of the ranking table (plain text; answer.py escapes them)."""
    spec = SPECS[ranking.objective]
    headers = [
        "policy",
        f"{spec.label}\n{spec.unit}",
        "95 % CI",
        f"vs {ranking.baseline}\n(Δ)",
        "95 % CI\nof Δ",
        "Δ\n%",
    ]
    rows = []
    for r in ranking.rows:  # best first
        is_base = r.policy == ranking.baseline
        rows.append(
            [
                r.policy + (" *" if is_base else ""),
                _fmt(spec.fmt, r.value.mean),
                "-" if not r.value.known else _span(spec.fmt, r.value),
                "0" if is_base else _signed(spec.fmt, r.diff.mean),
                "-" if is_base or not r.diff.known else _span(spec.fmt, r.diff),
                "-" if is_base or not math.isfinite(r.relative) else f"{r.relative:+.1%}",
            ]
        )
    for name in ranking.identical:
        rows.append([name, "= " + ranking.baseline, "-", "0", "-", "-"])
    return headers, rows


def ranking_lines(ranking: Ranking) -> list[str]:
    """The plain-text lines under the table: the interval note, identical policies, warnings."""
    spec = SPECS[ranking.objective]
    lines = []
    n = ranking.rows[0].value.n if ranking.rows else 0
    if n < MIN_SEEDS:
        lines.append(f"Intervals: n={n} seed(s) is too small for an interval; none is shown.")
    if ranking.identical:
        lines.append(
            f"Ran {ranking.baseline} only: {ranking.identical_reason}. Not run, identical by "
            f"construction: {', '.join(ranking.identical)}."
        )
    lines += [f"warning: {w}" for w in ranking.warnings]
    lines.append(
        f"Ranked on {spec.label}, {'higher' if spec.higher_is_better else 'lower'} is better "
        "(objective=ttft_p99|e2e_p99|goodput|restore_s|cost). * baseline. Δ: policy - "
        f"{ranking.baseline} on the same seed, mean over seeds, 95 % t interval; CI of the "
        "value: percentile bootstrap (never below 0)."
    )
    return lines


def _fmt(fmt: str, value: float) -> str:
    """`value` in `fmt` ("ms": 3 significant figures below 100, whole numbers above)."""
    if math.isnan(value):
        return "-"
    if fmt != "ms":
        return fmt.format(value)
    size = abs(value)
    return f"{value:.2f}" if size < 10 else f"{value:.1f}" if size < 100 else f"{value:,.0f}"


def _span(fmt: str, interval: Interval) -> str:
    return f"[{_fmt(fmt, interval.low)}, {_fmt(fmt, interval.high)}]"


def _signed(fmt: str, value: float) -> str:
    if math.isnan(value):
        return "-"
    return ("+" if value > 0 else "") + _fmt(fmt, value)
