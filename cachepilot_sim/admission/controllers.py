"""Admission controllers, registered by name: `all`, `threshold`, `learned`.

A controller sees an AdmissionView only for a new session's first turn while the pool is under
pressure (components/admission_gate.py decides when) and answers admit, defer or reject.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cachepilot_sim.admission.features import AdmissionView, features
from cachepilot_sim.admission.mlp import Mlp
from cachepilot_sim.config import ADMISSION, AdmissionConfig, bounded, require


class Decision(IntEnum):
    ADMIT = 0
    DEFER = 1
    REJECT = 2


class AdmissionController(Protocol):
    def decide(self, view: AdmissionView) -> Decision: ...


ControllerFactory = Callable[[Any, list[str]], AdmissionController]


def register(
    name: str, config: type[AdmissionConfig] = AdmissionConfig
) -> Callable[[ControllerFactory], ControllerFactory]:
    """Make a controller available as `admission=<name>`, reading `config` (an AdmissionConfig
    subclass declared beside it when it has knobs of its own). Duplicates are an error."""

    def wrap(factory: ControllerFactory) -> ControllerFactory:
        ADMISSION.add(name, factory, config)
        return factory

    return wrap


def make_controller(cfg: AdmissionConfig, feature_names: list[str]) -> AdmissionController:
    """The registered controller `cfg.name` (a ValueError lists the known names)."""
    factory: ControllerFactory = ADMISSION.entry(cfg.name).factory
    return factory(cfg, feature_names)


class AdmitAll:
    def decide(self, view: AdmissionView) -> Decision:
        return Decision.ADMIT


@register("all")
def _make_all(cfg: AdmissionConfig, feature_names: list[str]) -> AdmissionController:
    return AdmitAll()


class Threshold:
    """Defer, then reject once `max_defers` are spent, while the pool is loaded above
    `load_fraction` and more than `queue_depth` requests wait; admit otherwise."""

    def __init__(self, load_fraction: float, queue_depth: int) -> None:
        self.load_fraction = load_fraction
        self.queue_depth = queue_depth

    def decide(self, view: AdmissionView) -> Decision:
        load = view.held_bytes / max(view.pool_bytes, 1)
        if load <= self.load_fraction or view.queue_depth <= self.queue_depth:
            return Decision.ADMIT
        return Decision.DEFER if view.num_defers < view.max_defers else Decision.REJECT


@dataclass
class ThresholdAdmissionConfig(AdmissionConfig):
    """Defer (then reject) when (used + in flight) / pool > threshold_load_fraction and queue
    depth > threshold_queue_depth."""

    name: str = "threshold"
    threshold_load_fraction: float = bounded(0.9, ge=0, le=1)
    threshold_queue_depth: int = bounded(16, ge=0)


@register("threshold", config=ThresholdAdmissionConfig)
def _make_threshold(cfg: ThresholdAdmissionConfig, feature_names: list[str]) -> AdmissionController:
    return Threshold(cfg.threshold_load_fraction, cfg.threshold_queue_depth)


def allowed(view: AdmissionView) -> np.ndarray:
    """Actions open to the controller: no defer once `max_defers` are spent."""
    return np.array([True, view.num_defers < view.max_defers, True])


class Learned:
    """The MLP's argmax over allowed actions; with `rng`, samples instead (training) and logs
    (features, action, mask) per decision for the policy gradient."""

    def __init__(self, mlp: Mlp, rng: np.random.Generator | None = None) -> None:
        self.mlp = mlp
        self.rng = rng
        self.log: list[tuple[np.ndarray, int, np.ndarray]] = []

    def decide(self, view: AdmissionView) -> Decision:
        x = features(view)
        mask = allowed(view)
        z = np.where(mask, self.mlp.logits(x[None, :])[0], -np.inf)
        if self.rng is None:
            return Decision(int(np.argmax(z)))
        p = np.exp(z - z.max())
        p /= p.sum()
        a = int(self.rng.choice(3, p=p))
        self.log.append((x, a, mask))
        return Decision(a)


@dataclass
class LearnedAdmissionConfig(AdmissionConfig):
    """The learned controller reads its MLP's weights: the .npz written by train_admission."""

    name: str = "learned"
    weights: str = ""

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            bool(self.weights),
            f"{prefix}.weights",
            self.weights,
            "admission=learned needs admission.weights=PATH (an .npz from train_admission)",
        )


@register("learned", config=LearnedAdmissionConfig)
def _make_learned(cfg: LearnedAdmissionConfig, feature_names: list[str]) -> AdmissionController:
    return Learned(Mlp.load(Path(cfg.weights), feature_names))
