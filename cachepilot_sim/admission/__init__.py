"""Admission control of new sessions under KV pressure: features, controllers, the NumPy MLP."""

from cachepilot_sim.admission.controllers import (
    AdmissionController,
    Decision,
    make_controller,
)
from cachepilot_sim.admission.features import FEATURE_NAMES, AdmissionView, features
from cachepilot_sim.config.admission import known_controllers

__all__ = [
    "FEATURE_NAMES",
    "AdmissionController",
    "AdmissionView",
    "Decision",
    "features",
    "known_controllers",
    "make_controller",
]
