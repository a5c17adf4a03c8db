"""Offload and reload copies over the PCIe link, with the pool's bytes held in flight meanwhile.

A quantized CPU tier (`kv.offload_dtype_bytes` smaller than the GPU's) converts on the GPU before
an offload and after a reload (no PCIe lane held then) and moves the smaller form over the link;
the conversion is charged at the calibrated quantize rate.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TypeVar

import simpy
from simpy.core import URGENT

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.kv.protocol import KvStats
from cachepilot_sim.components.pcie_link import PcieLink, triggered
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import ModelConfig
from cachepilot_sim.cost import quantize_us
from cachepilot_sim.cost.kv_bytes import INT8_SCALE_BYTES, kv_bytes_per_token

T = TypeVar("T")


def cpu_kv_bytes_per_token(model: ModelConfig, offload_dtype_bytes: int) -> int:
    """KV bytes a token in the CPU store: the GPU's unless `offload_dtype_bytes` is smaller, then
    that many bytes a value plus a float32 scale per (layer, K|V) row (per-token quantization).
    """
    if offload_dtype_bytes in (0, model.kv_dtype_bytes):
        return kv_bytes_per_token(model, model.kv_dtype_bytes)
    return kv_bytes_per_token(model, offload_dtype_bytes, INT8_SCALE_BYTES)


class Transfers:
    """The copy processes both KV managers use; `pending_free_bytes` are offloads in flight."""

    __slots__ = ("env", "pool", "link", "stats", "quantize_bytes_per_us", "pending_free_bytes")

    def __init__(
        self,
        env: SimEnvironment,
        pool: VramPool,
        link: PcieLink,
        stats: KvStats,
        quantize_bytes_per_us: float,
    ) -> None:
        self.env = env
        self.pool = pool
        self.link = link
        self.stats = stats
        self.quantize_bytes_per_us = quantize_bytes_per_us
        self.pending_free_bytes = 0

    def convert_us(self, gpu_bytes: int, cpu_bytes: int) -> int:
        """GPU time to quantize KV for the CPU store (or dequantize it back); 0 for a copy."""
        if cpu_bytes == gpu_bytes:
            return 0
        return quantize_us(self.quantize_bytes_per_us, gpu_bytes, cpu_bytes)

    def reload_estimate_us(self, gpu_bytes: int, cpu_bytes: int) -> float:
        """What a reload of this KV would cost now on an idle link (copy + conversion)."""
        return float(
            self.link.duration_us("h2d", cpu_bytes) + self.convert_us(gpu_bytes, cpu_bytes)
        )

    def start_offload(self, gpu_bytes: int) -> None:
        """used -> in flight; the bytes will be free when the copy lands."""
        self.pool.start_offload(gpu_bytes)
        self.pending_free_bytes += gpu_bytes

    def offload_then(self, gpu_bytes: int, cpu_bytes: int, done: Callable[[int], None]) -> None:
        """Convert (if quantizing), copy out, free the GPU bytes, then `done(time paid, µs)`.

        No process per copy, but the events of one, in the same order: its start (urgent, now),
        the conversion's timeout, the lane's grant and the copy's timeout (`PcieLink`)."""
        env = self.env

        def copy_out(convert: int) -> None:
            def landed(copy_us: int) -> None:
                self.pool.finish_offload(gpu_bytes)
                self.pending_free_bytes -= gpu_bytes
                done(convert + copy_us)

            self.link.transfer_then("d2h", cpu_bytes, landed)

        def start(_: simpy.Event) -> None:
            convert = self.convert_us(gpu_bytes, cpu_bytes)
            if convert:
                self.stats.convert_us += convert
                env.timeout(convert).callbacks.append(  # type: ignore[union-attr]
                    lambda _: copy_out(convert)
                )
            else:
                copy_out(0)

        env.schedule(triggered(env, start), URGENT)

    def offload_each_then(
        self,
        gpu_bytes: int,
        cpu_bytes: int,
        items: Sequence[T],
        done: Callable[[T, int], None],
    ) -> None:
        """`offload_then` once per item, for copies started one after another with no other event
        scheduled between them (one eviction call's offloads): `done(item, time paid in µs)` as
        each lands. Their start events would be consecutive in the event order (urgent, now,
        consecutive ids) and each only converts or requests the lane, so one start event does the
        same for all, in order; every conversion, grant and landing is at the same time and place
        in the event order as with one start each. `start_offload` was called for each already."""
        env, link, items = self.env, self.link, list(items)
        convert = self.convert_us(gpu_bytes, cpu_bytes)

        def landed(item: T, copy_us: int) -> None:
            self.pool.finish_offload(gpu_bytes)
            self.pending_free_bytes -= gpu_bytes
            done(item, convert + copy_us)

        def copy_out(_: simpy.Event) -> None:
            link.transfer_each_then("d2h", cpu_bytes, items, landed)

        def start(_: simpy.Event) -> None:
            if convert:
                self.stats.convert_us += convert * len(items)
                env.timeout(convert).callbacks.append(copy_out)  # type: ignore[union-attr]
            else:
                copy_out(_)

        env.schedule(triggered(env, start), URGENT)

    def reload(self, gpu_bytes: int, cpu_bytes: int) -> Generator[simpy.Event, object, int]:
        """Process body: copy back into blocks already held in flight (`pool.start_reload`),
        then dequantize; the bytes are used when it returns. Returns the time paid (µs)."""
        duration = yield from self.link.transfer("h2d", cpu_bytes)
        convert = self.convert_us(gpu_bytes, cpu_bytes)
        if convert:
            self.stats.convert_us += convert
            yield self.env.timeout(convert)
            duration += convert
        self.pool.finish_reload(gpu_bytes)
        return duration
