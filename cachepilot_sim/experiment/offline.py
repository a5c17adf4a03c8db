"""Offline bounds over a recorded access sequence: what could the best policy have paid?

From a run's per-request table we know, per session, when each turn held its KV on the GPU (from
admission to finish) and the idle gap until the next turn was admitted. Any eviction policy that
faces this same sequence must, at every moment, fit the running turns plus the idle KV it keeps in
the KV pool; an idle KV it does not keep costs min(recompute, reload) when the next turn comes.
The LP relaxation of that generalized-caching problem (x = fraction of an idle KV given up for its
whole gap) is a lower bound on restore cost for this sequence. Two caveats, both in its favour: the
sequence itself depends on the policy that produced it (timing feeds back), and the bound ignores
PCIe queueing, the watermark and the CPU store's capacity. Belady's MIN (farthest next use first)
is exact where sizes and costs are uniform; `belady_misses` implements it for that case.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config import SimConfig
from cachepilot_sim.cost import compute_fit, recompute_us, transfer_fits, transfer_us
from cachepilot_sim.cost.kv_bytes import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class IdleGap:
    """Between two turns of a session: the KV's bytes, the gap [start, end) and its restore cost."""

    start_us: int
    end_us: int
    num_bytes: int
    restore_us: float


@dataclass(frozen=True, slots=True)
class AccessSequence:
    """Mandatory GPU residency of running turns (start, end, bytes) and the optional idle gaps."""

    running: tuple[tuple[int, int, int], ...]
    gaps: tuple[IdleGap, ...]
    capacity_bytes: int


def access_sequence(cfg: SimConfig, requests: pl.DataFrame) -> AccessSequence:
    """Derive the sequence from completed turns. Running KV is counted at its admission size (the
    smallest it held) and not at all for preempted turns, which can only lower the bound."""
    fit = compute_fit(cfg.hardware)
    h2d, _ = transfer_fits(cfg.hardware)
    block_tokens = cfg.kv.block_tokens
    block_bytes = [kv_bytes_per_token(m, m.kv_dtype_bytes) * block_tokens for m in cfg.models]
    done = requests.filter(pl.col("outcome") == "completed").sort(["session", "turn"])
    running: list[tuple[int, int, int]] = []
    gaps: list[IdleGap] = []
    prev: dict[str, int] | None = None
    for row in done.iter_rows(named=True):
        bb = block_bytes[row["model"]]
        admitted = -(-(row["context_tokens"] + row["prompt_tokens"]) // block_tokens) * bb
        if row["preemptions"] == 0:  # a preempted turn did not hold its KV all along: skip it
            running.append((row["admitted_us"], row["finish_us"], admitted))
        if prev is not None and prev["session"] == row["session"] and row["context_tokens"] > 0:
            num_bytes = -(-row["context_tokens"] // block_tokens) * block_bytes[prev["model"]]
            restore = recompute_us(fit, row["context_tokens"])
            if cfg.kv.offload_enabled and num_bytes <= cfg.kv.cpu_store_bytes:
                restore = min(restore, float(transfer_us(h2d, num_bytes)))
            if row["admitted_us"] > prev["finish_us"]:
                gaps.append(IdleGap(prev["finish_us"], row["admitted_us"], num_bytes, restore))
        prev = row
    return AccessSequence(tuple(running), tuple(gaps), cfg.kv_pool_bytes)


@dataclass(frozen=True, slots=True)
class LpBound:
    restore_us: float  # LP optimum: a lower bound on restore cost for the sequence
    never_kept_us: float  # restore cost if no idle KV were ever kept (the other extreme)
    num_gaps: int
    num_constraints: int


def _memory_rows(seq: AccessSequence) -> tuple[np.ndarray, Any, np.ndarray, int]:
    """(cost, A, b, points) of  A x >= b  at every point where memory rises.

    At every start t: running(t) + sum_{g covers t} (1 - x_g) bytes_g <= capacity, i.e.
    sum_{g covers t} x_g bytes_g >= idle(t) + running(t) - capacity. Memory only rises where a
    gap or a running turn starts, so those are the points to check. Where running turns alone
    exceed the capacity (cannot happen for a recorded run), every idle KV is given up there.
    """
    from scipy.sparse import csr_array

    n = len(seq.gaps)
    starts = np.array([g.start_us for g in seq.gaps], dtype=np.int64)
    ends = np.array([g.end_us for g in seq.gaps], dtype=np.int64)
    run = np.array(seq.running, dtype=np.int64).reshape(-1, 3)
    points = np.unique(np.concatenate([starts, run[:, 0]]))
    # Running bytes at each point: turns with admitted <= t < finish.
    lo = np.searchsorted(points, run[:, 0], side="left")
    hi = np.searchsorted(points, run[:, 1], side="left")
    load = np.zeros(len(points) + 1)
    np.add.at(load, lo, run[:, 2])
    np.add.at(load, hi, -run[:, 2])
    running_bytes = np.cumsum(load)[:-1]
    first = np.searchsorted(points, starts, side="left")
    last = np.searchsorted(points, ends, side="left")  # gap covers points[first:last]
    rows = np.concatenate([np.arange(a, b) for a, b in zip(first, last, strict=True)])
    cols = np.repeat(np.arange(n), last - first)
    sizes = np.array([g.num_bytes for g in seq.gaps], dtype=np.float64)
    scale = float(sizes.max())  # keep coefficients near 1 for the solver
    a = csr_array((sizes[cols] / scale, (rows, cols)), shape=(len(points), n))
    idle_total = a @ np.ones(n)
    need = np.minimum(idle_total + (running_bytes - seq.capacity_bytes) / scale, idle_total)
    cost = np.array([g.restore_us for g in seq.gaps])
    return cost, a, need, len(points)


def lp_lower_bound(seq: AccessSequence) -> LpBound:
    """min sum x_g restore_g  s.t. the memory rows (`_memory_rows`), 0 <= x <= 1."""
    from scipy.optimize import linprog

    n = len(seq.gaps)
    if n == 0:
        return LpBound(0.0, 0.0, 0, 0)
    cost, a, need, num_points = _memory_rows(seq)
    res = linprog(cost, A_ub=-a, b_ub=-need, bounds=(0, 1), method="highs")
    if res.status != 0:
        raise RuntimeError(f"offline LP failed: {res.message}")
    return LpBound(float(res.fun), float(cost.sum()), n, num_points)


@dataclass(frozen=True, slots=True)
class OfflineOptimum:
    restore_us: float  # best 0/1 solution found (each idle KV kept for its whole gap or not)
    bound_us: float  # proven lower bound (equals restore_us when optimal)
    optimal: bool


def integral_optimum(seq: AccessSequence, time_limit_s: float = 60.0) -> OfflineOptimum:
    """The same problem with x in {0, 1} (HiGHS): the offline optimum of this memory model, since
    an offline policy loses nothing by giving up a KV at the start of its gap. Slow (10-30 s for
    a 1000-request run), so it is a one-off measurement, not part of every cell."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not seq.gaps:
        return OfflineOptimum(0.0, 0.0, True)
    cost, a, need, _ = _memory_rows(seq)
    res = milp(
        cost,
        constraints=[LinearConstraint(a, need, np.inf)],
        integrality=np.ones(len(cost)),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit_s},
    )
    if res.x is None:
        raise RuntimeError(f"offline MILP found no solution: {res.message}")
    value = float(cost @ np.round(res.x))
    bound = float(getattr(res, "mip_dual_bound", value))  # HiGHS stops at a 1e-4 relative gap
    return OfflineOptimum(value, min(bound, value), res.status == 0)


def belady_misses(accesses: Sequence[Hashable], capacity: int) -> int:
    """Belady's MIN for unit sizes and costs: misses (first accesses included) with `capacity`
    slots, evicting the resident item whose next access is farthest (never: first)."""
    n = len(accesses)
    if capacity <= 0:
        return n
    next_use = [n] * n
    seen: dict[Hashable, int] = {}
    for i in range(n - 1, -1, -1):
        next_use[i] = seen.get(accesses[i], n + i)  # never again: beyond every real access
        seen[accesses[i]] = i
    resident: dict[Hashable, int] = {}  # item -> its next use
    heap: list[tuple[int, int, Hashable]] = []  # (-next use, tie, item); stale entries skipped
    misses = 0
    for i, item in enumerate(accesses):
        if item not in resident:
            misses += 1
            if len(resident) >= capacity:
                while True:
                    neg, _, victim = heapq.heappop(heap)
                    if resident.get(victim) == -neg:
                        del resident[victim]
                        break
        resident[item] = next_use[i]
        heapq.heappush(heap, (-next_use[i], i, item))
    return misses


def offline_metrics(cfg: SimConfig, requests: pl.DataFrame) -> dict[str, float]:
    """The LP bound in seconds, for the runner's table (realized restore s is the cell's own)."""
    bound = lp_lower_bound(access_sequence(cfg, requests))
    return {
        "offline_lp_restore_s": bound.restore_us / 1e6,
        "offline_never_kept_s": bound.never_kept_us / 1e6,
        "offline_gaps": bound.num_gaps,
    }
