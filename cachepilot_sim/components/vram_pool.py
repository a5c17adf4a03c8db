"""GPU memory: pinned model weights plus a paged KV pool counted in bytes (blocks differ per model).

Every KV byte is free, used, or in flight (a PCIe transfer holds it), never two: the three counters
always sum to the pool's capacity. Weights are pinned at construction and no operation touches them.
"""

from __future__ import annotations

from typing import Protocol

from cachepilot_sim.config import SimConfig


class PoolView(Protocol):
    """A read-only view of the pool's counters (what the batcher and the admission gate read)."""

    @property
    def capacity_bytes(self) -> int:
        """Bytes of the KV pool."""

    @property
    def free_bytes(self) -> int:
        """Bytes neither used nor in flight."""

    @property
    def used_bytes(self) -> int:
        """Bytes held by KV on the GPU."""

    @property
    def in_flight_bytes(self) -> int:
        """Bytes held by copies in progress."""


class VramPool:
    """Byte accounting of the KV pool; callers convert blocks to bytes with their model's block
    size.
    """

    def __init__(self, cfg: SimConfig) -> None:
        self.pinned_weight_bytes = sum(m.weight_bytes for m in cfg.models)
        self.capacity_bytes = cfg.kv_pool_bytes
        self.free_bytes = self.capacity_bytes
        self.used_bytes = 0
        self.in_flight_bytes = 0

    def _check(self, ok: bool, op: str, num_bytes: int) -> None:
        if not ok or num_bytes < 0:
            raise RuntimeError(
                f"VRAM pool {op}({num_bytes}) violates accounting: free={self.free_bytes} "
                f"used={self.used_bytes} in_flight={self.in_flight_bytes}"
            )

    def allocate(self, num_bytes: int) -> None:
        """free -> used."""
        self._check(num_bytes <= self.free_bytes, "allocate", num_bytes)
        self.free_bytes -= num_bytes
        self.used_bytes += num_bytes

    def release(self, num_bytes: int) -> None:
        """used -> free."""
        self._check(num_bytes <= self.used_bytes, "release", num_bytes)
        self.used_bytes -= num_bytes
        self.free_bytes += num_bytes

    def start_offload(self, num_bytes: int) -> None:
        """used -> in flight: the blocks are being copied out and cannot be reused yet."""
        self._check(num_bytes <= self.used_bytes, "start_offload", num_bytes)
        self.used_bytes -= num_bytes
        self.in_flight_bytes += num_bytes

    def finish_offload(self, num_bytes: int) -> None:
        """in flight -> free."""
        self._check(num_bytes <= self.in_flight_bytes, "finish_offload", num_bytes)
        self.in_flight_bytes -= num_bytes
        self.free_bytes += num_bytes

    def start_reload(self, num_bytes: int) -> None:
        """free -> in flight: destination blocks of a copy from the CPU store."""
        self._check(num_bytes <= self.free_bytes, "start_reload", num_bytes)
        self.free_bytes -= num_bytes
        self.in_flight_bytes += num_bytes

    def finish_reload(self, num_bytes: int) -> None:
        """in flight -> used."""
        self._check(num_bytes <= self.in_flight_bytes, "finish_reload", num_bytes)
        self.in_flight_bytes -= num_bytes
        self.used_bytes += num_bytes

    def conserved(self) -> bool:
        """True when free + used + in flight == capacity and none is negative."""
        return (
            self.free_bytes + self.used_bytes + self.in_flight_bytes == self.capacity_bytes
            and min(self.free_bytes, self.used_bytes, self.in_flight_bytes) >= 0
        )
