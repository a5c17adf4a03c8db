"""How far each engine profile was measured from a real engine, per GPU: conf/trust.json.

The file is generated from the committed `validate --json` error tables by
`python -m cachepilot_sim.tools.trust_table` (a test regenerates it and compares), never edited by
hand. Here it is only read: which GPUs a fitted step cost has real-engine errors on, and how large.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config.hardware import GpuSpecConfig

REGISTRY_PATH = CONF_DIR / "trust.json"
FAMILIES = ("ttft", "tpot", "e2e")  # the metric families every bound is given for


@dataclass(frozen=True, slots=True)
class Measurement:
    """One engine profile's errors against one GPU's captures (fractions, max |error| over the
    workloads below memory pressure: mean and p99 per family; `pressure_mean` over the others)."""

    engine: str
    engine_version: str
    gpu: str  # conf/gpu preset the captures ran on
    device: str  # the name the CUDA driver reported for it
    gpu_figures: tuple[float | int, ...]  # GpuSpecConfig.figures() of that preset
    fitted_on: str  # the device the step cost was fitted on
    source: str  # the errors.json it was read from, relative to the repository root
    workloads: tuple[str, ...]
    pressure_workloads: tuple[str, ...]
    mean: dict[str, float]
    p99: dict[str, float]
    pressure_mean: dict[str, float]

    @property
    def transfer(self) -> bool:
        """The step cost was fitted on another GPU than the one these captures ran on."""
        return self.device != self.fitted_on

    def matches(self, gpu: GpuSpecConfig) -> bool:
        """`gpu` is the captured part: its preset name and every figure that changes time."""
        return gpu.name == self.gpu and gpu.figures() == self.gpu_figures


def _measurement(raw: dict[str, Any]) -> Measurement:
    return Measurement(
        engine=raw["engine"],
        engine_version=raw["engine_version"],
        gpu=raw["gpu"],
        device=raw["device"],
        gpu_figures=tuple(raw["gpu_figures"]),
        fitted_on=raw["fitted_on"],
        source=raw["source"],
        workloads=tuple(raw["workloads"]),
        pressure_workloads=tuple(raw["pressure_workloads"]),
        mean=dict(raw["mean"]),
        p99=dict(raw["p99"]),
        pressure_mean=dict(raw["pressure_mean"]),
    )


@cache
def measurements() -> tuple[Measurement, ...]:
    """Every committed measurement, in the registry's order."""
    raw = json.loads(REGISTRY_PATH.read_text())
    return tuple(_measurement(m) for m in raw["measurements"])


def measurement_for(engine: str, gpu: GpuSpecConfig) -> Measurement | None:
    """The measurement of engine profile `engine` on `gpu`, if its captures ran on that part."""
    return next((m for m in measurements() if m.engine == engine and m.matches(gpu)), None)


def measured_gpus(engine: str) -> list[str]:
    """The conf/gpu presets `engine` has real-engine errors on."""
    return [m.gpu for m in measurements() if m.engine == engine]


def transfer_floor(engine: str) -> float:
    """The largest mean error of `engine` on any GPU it was not fitted on (0: never moved): what
    a move to a GPU with no captures costs at least, since it was that much on a measured move."""
    moved = [m for m in measurements() if m.engine == engine and m.transfer]
    return max((max(m.mean.values()) for m in moved), default=0.0)
