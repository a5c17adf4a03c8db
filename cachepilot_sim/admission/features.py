"""What the scheduler sees when it decides on a new session: a few cheap, scaled numbers.

The view is filled by the admission gate from counters the KV manager and the scheduler already
keep (no scan of the trace); `features` turns it into the MLP's input vector, each entry O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The order of the MLP's inputs; saved beside the weights so a stale file is caught at load.
BASE_FEATURES = (
    "queue_depth_scaled",  # queued requests / 32
    "free_fraction",  # free KV bytes / pool
    "evictable_fraction",  # idle (cached, evictable) KV bytes / pool
    "load_fraction",  # (used + in flight) KV bytes / pool
    "need_fraction",  # this request's KV need / pool
    "context_log_scaled",  # log1p(context + prompt tokens) / log1p(32768)
    "eviction_rate_scaled",  # evictions per simulated second (EMA) / 50, clipped to [0, 4]
    "running_fraction",  # running sequences / max sequences
    "defers_fraction",  # times this request was deferred / max_defers
)
QUEUE_SCALE = 32.0
CONTEXT_SCALE = math.log1p(32768)
EVICTION_RATE_SCALE = 50.0


@dataclass(slots=True)
class AdmissionView:
    """The state one admission decision sees (bytes, counts, tokens)."""

    queue_depth: int
    pool_bytes: int
    free_bytes: int
    evictable_bytes: int
    held_bytes: int  # used + in flight
    need_bytes: int
    tokens: int  # context + prompt tokens of the request
    class_index: int
    num_classes: int
    eviction_rate_per_s: float
    running_fraction: float
    num_defers: int
    max_defers: int

    @property
    def under_pressure_bytes(self) -> bool:
        """The request cannot fit even after evicting every idle session."""
        return self.need_bytes > self.free_bytes + self.evictable_bytes


def feature_names(class_names: list[str]) -> list[str]:
    return [*BASE_FEATURES, *(f"class_{c}" for c in class_names)]


FEATURE_NAMES = BASE_FEATURES


def features(v: AdmissionView) -> np.ndarray:
    """The input vector: BASE_FEATURES then a one-hot of the request's class (float64)."""
    pool = float(max(v.pool_bytes, 1))
    x = np.zeros(len(BASE_FEATURES) + v.num_classes)
    x[0] = v.queue_depth / QUEUE_SCALE
    x[1] = v.free_bytes / pool
    x[2] = v.evictable_bytes / pool
    x[3] = v.held_bytes / pool
    x[4] = v.need_bytes / pool
    x[5] = math.log1p(v.tokens) / CONTEXT_SCALE
    x[6] = min(v.eviction_rate_per_s / EVICTION_RATE_SCALE, 4.0)
    x[7] = v.running_fraction
    x[8] = v.num_defers / v.max_defers if v.max_defers else 1.0
    x[len(BASE_FEATURES) + v.class_index] = 1.0
    return x
