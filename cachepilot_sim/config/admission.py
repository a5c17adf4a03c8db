"""Admission control's config: the fields every controller's gate reads, and the registry.

A controller with its own knobs declares a subclass next to its code and registers it
(admission/controllers.py), as eviction policies do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from cachepilot_sim.config.base import Sealed, bounded
from cachepilot_sim.config.registry import Registry


@dataclass
class AdmissionConfig(Sealed):
    """Admission control of new sessions under KV pressure (docs/admission.md).

    `all` admits everything (the behaviour without admission control). The others are consulted
    only for a session's first turn, and only while the pool is under pressure: the request's KV
    need exceeds free + evictable bytes, or `pressure_queue_depth` requests are queued.
    """

    section: ClassVar[str | None] = "admission"
    name: str = "all"
    defer_ms: float = bounded(200.0, ge=0)  # a deferred request re-enters the queue after this
    max_defers: int = bounded(3, ge=0)  # after this many defers a defer counts as admit
    pressure_queue_depth: int = bounded(8, ge=0)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        ADMISSION.check(f"{prefix}.name", self)


# Filled by admission/controllers.py; the factory is (AdmissionConfig, feature names) ->
# AdmissionController.
ADMISSION: Registry[AdmissionConfig, Any] = Registry(
    "admission controller", "admission", AdmissionConfig, provider="cachepilot_sim.admission"
)


def known_controllers() -> list[str]:
    return ADMISSION.names()


def admission_config(name: str, **values: Any) -> AdmissionConfig:
    """The registered config class of controller `name`, built with `values` (validated)."""
    return ADMISSION.entry(name).config(name=name, **values)
