"""How far to trust a run's numbers: which engine and hardware profile produced them, and the error
that profile showed against a real engine's captures (conf/trust.json, from the committed
`validate` error tables), put on every answer as one line (`engine_label`).

Four kinds. `measured`: the step cost was fitted on this GPU and replayed against its captures.
`transferred`: fitted on another GPU, replayed unchanged against this GPU's captures. `datasheet`:
a fitted step cost on a GPU with no captures; its error is at least its measured transfer's
(config/run.py refuses such a run, naming this bound). `unvalidated`: the roofline step cost,
which no real-engine capture has been compared with, on any GPU (or a new fit whose errors are
not committed yet, on the H200 only, as config/run.py allows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from cachepilot_sim.config import EngineConfig, GpuSpecConfig, SimConfig, StepCost
from cachepilot_sim.config.trust_registry import FAMILIES, Measurement, measurement_for
from cachepilot_sim.config.trust_registry import measurements as all_measurements
from cachepilot_sim.cost.gpu_scaling import is_measured

UNVALIDATED_NOTE = "idealised engine, no real-engine captures"
UNVALIDATED_FIT = "fitted step cost with no committed real-engine errors"


class TrustKind(StrEnum):
    MEASURED = "measured"
    TRANSFERRED = "transferred"
    DATASHEET = "datasheet"
    UNVALIDATED = "unvalidated"


@dataclass(frozen=True, slots=True)
class Trust:
    """One answer's engine and hardware profile and its error bound per metric family
    (fractions: the max |error| over the committed workloads below memory pressure; with
    `lower_bound`, the true error is at least this; empty: no bound is known)."""

    engine: str
    engine_version: str  # the real engine the profile imitates ("" for the roofline engine)
    hardware: str  # the GPU preset, with its TP degree beyond 1
    hardware_basis: str  # where the hardware's figures came from
    kind: TrustKind
    mean: dict[str, float] = field(default_factory=dict)
    p99: dict[str, float] = field(default_factory=dict)
    lower_bound: bool = False
    fitted_on: str = ""  # the GPU the step cost was fitted on ("" for roofline)
    reason: str = ""  # why an `unvalidated` answer is
    num_workloads: int = 0
    source: str = ""  # the errors.json the bounds come from

    def as_dict(self) -> dict[str, Any]:
        """The `trust` object of metrics.json and plan.json: the fields and the label."""
        return asdict(self) | {"kind": str(self.kind), "label": engine_label(self)}


def _hardware(gpu: GpuSpecConfig, tp: int) -> str:
    return gpu.name + (f" x tp{tp}" if tp > 1 else "")


def _roofline_basis(gpu: GpuSpecConfig, tp: int) -> str:
    basis = "the project's H200 kernel calibration"
    if not is_measured(gpu):
        basis = "the H200 calibration scaled by datasheet ratios, not measured"
    return basis + (f"; tp={tp} all-reduce derived, not measured" if tp > 1 else "")


def _from(kind: TrustKind, engine: EngineConfig, hardware: str, m: Measurement) -> Trust:
    basis = f"{m.device} captures" if kind != TrustKind.DATASHEET else "no captures on this GPU"
    return Trust(
        engine=engine.name,
        engine_version=m.engine_version,
        hardware=hardware,
        hardware_basis=basis,
        kind=kind,
        mean=dict(m.mean),
        p99={} if kind == TrustKind.DATASHEET else dict(m.p99),
        lower_bound=kind == TrustKind.DATASHEET,
        fitted_on=m.fitted_on,
        num_workloads=len(m.workloads),
        source=m.source,
    )


def trust_of(engine: EngineConfig, gpu: GpuSpecConfig, tp: int = 1) -> Trust:
    """The trust of `engine` on `tp` x `gpu` (module docstring: the four kinds)."""
    if engine.step_cost == StepCost.ROOFLINE:  # fitted and physical costs come from captures
        basis = _roofline_basis(gpu, tp)
        return Trust(
            engine.name, "", _hardware(gpu, tp), basis, TrustKind.UNVALIDATED,
            reason=UNVALIDATED_NOTE,
        )  # fmt: skip
    m = measurement_for(engine.name, gpu) if tp == 1 else None
    if m is not None and m.fitted_on == engine.fitted_on:
        kind = TrustKind.TRANSFERRED if m.transfer else TrustKind.MEASURED
        return _from(kind, engine, gpu.name, m)
    if not any(x.engine == engine.name for x in all_measurements()):
        return Trust(
            engine.name, "", _hardware(gpu, tp), f"fitted on {engine.fitted_on or 'a GPU'}",
            TrustKind.UNVALIDATED, fitted_on=engine.fitted_on, reason=UNVALIDATED_FIT,
        )  # fmt: skip
    # No captures here: the worst measured move of this step cost is the floor of this one.
    moved = [x for x in all_measurements() if x.engine == engine.name and x.transfer]
    if moved:
        worst = max(moved, key=lambda x: max(x.mean.values()))
        return _from(TrustKind.DATASHEET, engine, _hardware(gpu, tp), worst)
    basis = "no captures on this GPU"
    return Trust(
        engine.name, "", _hardware(gpu, tp), basis, TrustKind.DATASHEET, lower_bound=True,
        fitted_on=engine.fitted_on,
    )  # fmt: skip


def trust_for(cfg: SimConfig) -> Trust:
    """The trust of the run `cfg` describes: its engine profile on its GPU and TP degree."""
    return trust_of(cfg.engine, cfg.gpu, cfg.tp)


def _percents(bounds: dict[str, float]) -> str:
    return "/".join(f"±{100 * bounds[f]:.1f}" for f in FAMILIES) + " %"


def engine_label(t: Trust) -> str:
    """One line: engine, hardware, kind, and the error bound, e.g. `engine hf_cb
    (transformers-continuous-batching 5.17.0), hardware h200: measured on this GPU, mean
    TTFT/TPOT/E2E within ±2.8/±2.8/±2.3 %, p99 within ±6.2/±2.4/±2.3 % (8 workloads below memory
    pressure)`. Plain text (no Rich markup)."""
    what = f" ({t.engine_version})" if t.engine_version else ""
    if not t.engine_version and not t.fitted_on:
        what = " (roofline step cost)"
    head = f"engine {t.engine}{what}, hardware {t.hardware}"
    names = "TTFT/TPOT/E2E"
    if t.kind == TrustKind.UNVALIDATED:
        return f"{head} ({t.hardware_basis}): unvalidated ({t.reason})"
    if t.kind == TrustKind.DATASHEET:
        floor = "error unknown"
        if t.mean:
            floor = f"mean {names} error at least {_percents(t.mean)} (its measured transfer)"
        moved = f"the {t.fitted_on} step cost unscaled" if t.fitted_on else "nothing measured"
        return f"{head}: datasheet only (no captures on this GPU, {moved}), {floor}"
    bounds = f"mean {names} within {_percents(t.mean)}, p99 within {_percents(t.p99)}"
    tail = f" ({t.num_workloads} workloads below memory pressure)"
    if t.kind == TrustKind.MEASURED:
        return f"{head}: measured on this GPU, {bounds}{tail}"
    moved = (
        f"transferred from {t.fitted_on} (step cost fitted there, replayed on this GPU's captures)"
    )
    return f"{head}: {moved}, {bounds}{tail}"
