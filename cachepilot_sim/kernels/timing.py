"""Device timing helpers for the GPU benchmark: CUDA-event medians, environment, copy ceilings.

Each measurement warms up, then times `reps` launches one at a time with CUDA events on the stream
the work runs on, and keeps the median (and min/max): the spread says whether two variants differ.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

GB = 1e9


@dataclass(slots=True)
class Timing:
    """One timed variant; `bytes_counted` says which bytes the rate counts (see `note`)."""

    section: str
    variant: str
    size_label: str
    bytes_counted: int
    median_us: float
    min_us: float
    max_us: float
    reps: int
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes_counted / (self.median_us * 1e-6) / GB

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gbps": round(self.gbps, 2)}


def reps_for(expected_us: float, budget_us: float = 200_000.0, lo: int = 5, hi: int = 50) -> int:
    """Enough repetitions to fill about `budget_us` of device time, clamped to [lo, hi]."""
    return max(lo, min(hi, int(budget_us / max(expected_us, 1.0))))


HIDE_LAUNCH_CYCLES = 400_000  # ~200 us at 1.98 GHz: longer than any single-launch enqueue here


def time_us(
    fn: Callable[[int], object],
    reps: int,
    warmup: int = 3,
    stream: Any = None,
    hide_launch: bool = True,
    hide_cycles: int = HIDE_LAUNCH_CYCLES,
) -> tuple[float, float, float]:
    """(median, min, max) microseconds of fn(rep) on `stream` (default: torch's current stream).

    Not triton.testing.do_bench: it times from the host's launch (no sleep kernel to hide Python's
    10-40 us enqueue) and reports no min/max; both matter for the swap kernels' small copies.

    fn receives the repetition index, so callers can rotate inputs and keep them out of L2.
    hide_launch: a sleep kernel ahead of the start event keeps the device busy while Python
    enqueues fn, so the events time the device work, not the host's launch overhead (what a C++
    engine would pay is a few us; Python launchers pay 10-40 us). hide_cycles: the sleep's length;
    work that enqueues many operations (a pipelined copy + scatter) needs a longer one.
    """
    import torch

    stream = torch.cuda.current_stream() if stream is None else stream
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times: list[float] = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hide_launch:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(hide_cycles)
        start.record(stream)
        fn(i)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times), min(times), max(times)


def measure(
    section: str,
    variant: str,
    size_label: str,
    bytes_counted: int,
    fn: Callable[[int], object],
    expected_us: float,
    note: str = "",
    stream: Any = None,
    hide_cycles: int = HIDE_LAUNCH_CYCLES,
    hide_launch: bool = True,
    **extra: Any,
) -> Timing:
    reps = reps_for(expected_us)
    med, lo, hi = time_us(fn, reps, stream=stream, hide_launch=hide_launch, hide_cycles=hide_cycles)
    how = "device time (launch hidden)" if hide_launch else "launch included"
    note = f"{note}; {how}" if note else how
    return Timing(section, variant, size_label, bytes_counted, med, lo, hi, reps, note, extra)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"


def environment() -> dict[str, Any]:
    """Device, driver and library versions recorded with every result file."""
    import torch

    env: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "num_sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "nvidia_smi": _run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,pcie.link.gen.max,"
                "pcie.link.width.max,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader",
            ]
        ),
        "nvcc": _run(["nvcc", "--version"]).splitlines()[-1:],
    }
    for mod in ("triton", "cupy", "numpy", "scipy", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as err:  # a missing library is recorded, not fatal
            env[mod] = f"unavailable: {err}"
    return env


def hbm_copy(num_bytes: int = 4 << 30) -> Timing:
    """Device-to-device copy ceiling, counting bytes read plus written."""
    import torch

    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = measure(
        "ceiling",
        "hbm_copy_d2d",
        f"{num_bytes >> 20}MiB",
        2 * num_bytes,
        lambda i: dst.copy_(src),
        2 * num_bytes / 4e12 * 1e6,
        "bytes read + written",
    )

    return t


def pinned_copy(num_bytes: int, to_host: bool) -> Timing:
    """One plain copy_ between device memory and pinned host memory of `num_bytes`."""
    import torch

    dev = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device="cuda")
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    if to_host:
        fn: Callable[[int], object] = lambda i: host.copy_(dev, non_blocking=True)  # noqa: E731
    else:
        fn = lambda i: dev.copy_(host, non_blocking=True)  # noqa: E731
    name = "pinned_copy_d2h" if to_host else "pinned_copy_h2d"
    return measure("pcie", name, _size_label(num_bytes), num_bytes, fn, num_bytes / 50e3)


def _size_label(num_bytes: int) -> str:
    return f"{num_bytes >> 20}MiB" if num_bytes >= 1 << 20 else f"{num_bytes >> 10}KiB"
