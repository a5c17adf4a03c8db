"""The PCIe link to the CPU store: one SimPy resource per direction.

Transfers in one direction queue behind each other (one DMA stream each way); the two directions and
the GPU's compute run concurrently, as with separate copy engines.
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cost import TransferFit, transfer_us


class PcieLink:
    """Two DMA lanes (h2d, d2h), each serving one transfer at a time."""

    def __init__(self, env: SimEnvironment, h2d: TransferFit, d2h: TransferFit) -> None:
        self.env = env
        self.fits = {"h2d": h2d, "d2h": d2h}
        self.lanes = {
            "h2d": simpy.Resource(env, capacity=1),
            "d2h": simpy.Resource(env, capacity=1),
        }
        self.busy_us = {"h2d": 0, "d2h": 0}
        self.bytes_moved = {"h2d": 0, "d2h": 0}

    def duration_us(self, direction: str, num_bytes: int) -> int:
        """Service time of one transfer of `num_bytes` in `direction` (µs)."""
        return transfer_us(self.fits[direction], num_bytes)

    def transfer(self, direction: str, num_bytes: int) -> Generator[simpy.Event, object, int]:
        """Process: queue for the direction's lane, hold it for the transfer time.

        Yields the lane request and one timeout; returns the service time in microseconds.
        """
        duration = self.duration_us(direction, num_bytes)
        with self.lanes[direction].request() as lane:
            yield lane
            yield self.env.timeout(duration)
        self.busy_us[direction] += duration
        self.bytes_moved[direction] += num_bytes
        return duration
