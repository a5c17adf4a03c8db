"""A trace made ready for replay: validated rows, arrival times (scaled, or Poisson for ShareGPT),
and inferred sessions. Built once per simulation from `SimConfig.replay`; files are read only here
and in `workloads/traces.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cachepilot_sim.clock import s_to_us
from cachepilot_sim.config import SimConfig, TraceFormat
from cachepilot_sim.workloads.sessions import Sessions, infer_sessions
from cachepilot_sim.workloads.traces import MAX_TIME_US, TraceError, TraceTable, read_trace

SAMPLES_DIR = Path(__file__).parent / "samples"
TRACES_DIR_ENV = "CACHEPILOT_TRACES_DIR"


@dataclass(frozen=True, slots=True)
class ReplayWorkload:
    """Request i arrives at arrival_us[i] with the trace's lengths and hash ids."""

    table: TraceTable
    arrival_us: np.ndarray
    sessions: Sessions
    # Closed-loop turns (ground-truth replay): request i with a parent and think_us[i] >= 0 is
    # sent think_us[i] after its parent's last token, not at arrival_us[i]. None: all open loop.
    think_us: np.ndarray | None = None

    @property
    def num_requests(self) -> int:
        return self.table.num_requests


def resolve_path(path: str) -> Path:
    """`samples:<file>` names a shipped sample; anything else is a path (relative to the cwd)."""
    if path.startswith("samples:"):
        return SAMPLES_DIR / path.removeprefix("samples:")
    return Path(os.path.expanduser(path))


def poisson_arrivals_us(rng: np.random.Generator, rate_per_s: float, n: int) -> np.ndarray:
    """Arrival times of a Poisson process (first request at 0), integer microseconds."""
    gaps = rng.exponential(1.0 / rate_per_s, size=n)
    gaps[0] = 0.0
    return np.fromiter((s_to_us(t) for t in np.cumsum(gaps)), dtype=np.int64, count=n)


def scale_arrivals(table: TraceTable, arrival_us: np.ndarray, time_scale: float) -> np.ndarray:
    """arrival x time_scale in integer us, range-checked before the int64 conversion."""
    scaled = arrival_us.astype(np.float64) * time_scale
    over = np.flatnonzero(~(np.abs(scaled) <= MAX_TIME_US))
    if over.size:
        i = int(over[0])
        raise TraceError(
            f"{table.path}:{int(table.line[i])}: arrival {int(arrival_us[i])} us x "
            f"replay.time_scale={time_scale:g} is over the limit of {MAX_TIME_US} us"
        )
    return np.rint(scaled).astype(np.int64)


def load_replay(cfg: SimConfig, rng: np.random.Generator) -> ReplayWorkload:
    """Read, validate and limit the configured trace; arrivals and sessions for the simulator."""
    rc = cfg.replay
    table = read_trace(rc.format, resolve_path(rc.path), rc.on_error, rc.hash_block_tokens)
    table = table.head(rc.limit)
    if rc.format == TraceFormat.SHAREGPT:  # no times in the file: Poisson, then scaled as well
        arrival = poisson_arrivals_us(rng, rc.arrival_rate_per_s, table.num_requests)
    else:
        arrival = table.arrival_us
    arrival = scale_arrivals(table, arrival, rc.time_scale)
    if rc.infer_sessions and table.hash_offsets is not None:
        sessions = infer_sessions(table, rc.hash_block_tokens)
    else:
        sessions = Sessions.singletons(table.num_requests)
    return ReplayWorkload(table, arrival, sessions)
