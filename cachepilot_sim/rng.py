"""One seed, one independent NumPy Generator per simulation component, split in a fixed order.

No component draws from a global RNG: adding draws in one component never shifts another's stream,
so two policies run on the same seed see the same sessions, lengths and think times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The order is part of the reproducibility contract: append new streams at the end only.
STREAM_NAMES: tuple[str, ...] = ("arrivals", "sessions", "lengths", "think_times", "spare")


@dataclass(frozen=True, slots=True)
class RngStreams:
    arrivals: np.random.Generator
    sessions: np.random.Generator
    lengths: np.random.Generator
    think_times: np.random.Generator
    spare: np.random.Generator


def make_streams(seed: int) -> RngStreams:
    """Split `seed` into one Generator per component with `SeedSequence.spawn`."""
    children = np.random.SeedSequence(seed).spawn(len(STREAM_NAMES))
    gens = {
        name: np.random.Generator(np.random.PCG64(c))
        for name, c in zip(STREAM_NAMES, children, strict=False)
    }
    return RngStreams(**gens)
