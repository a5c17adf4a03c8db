"""Admission controllers, registered by name: `all`, `threshold`, `learned`.

A controller sees an AdmissionView only for a new session's first turn while the pool is under
pressure (components/admission_gate.py decides when) and answers admit, defer or reject.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Protocol

import numpy as np

from cachepilot_sim.admission.features import AdmissionView, features
from cachepilot_sim.admission.mlp import Mlp
from cachepilot_sim.config import AdmissionConfig


class Decision(IntEnum):
    ADMIT = 0
    DEFER = 1
    REJECT = 2


class AdmissionController(Protocol):
    def decide(self, view: AdmissionView) -> Decision: ...


_REGISTRY: dict[str, Callable[[AdmissionConfig, list[str]], AdmissionController]] = {}


def register(name: str) -> Callable[[Callable], Callable]:
    def wrap(factory: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"admission controller {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def known_controllers() -> list[str]:
    return sorted(_REGISTRY)


def make_controller(cfg: AdmissionConfig, feature_names: list[str]) -> AdmissionController:
    if cfg.name not in _REGISTRY:
        raise ValueError(f"unknown admission controller {cfg.name!r}; known: {known_controllers()}")
    return _REGISTRY[cfg.name](cfg, feature_names)


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


@register("threshold")
def _make_threshold(cfg: AdmissionConfig, feature_names: list[str]) -> AdmissionController:
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


@register("learned")
def _make_learned(cfg: AdmissionConfig, feature_names: list[str]) -> AdmissionController:
    return Learned(Mlp.load(Path(cfg.weights), feature_names))
