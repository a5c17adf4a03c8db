"""Training rows for the reuse forecast: one per release, its features' raw state and its next gap.

From the event trace of a session workload (`release_rows_from_trace`): a `finish` row is a release
(the KV manager calls the policy's on_release just before it), the request's `arrive` row gives
its class and tokens in, `reuse_gap` rows give the session's earlier gaps and the label (the next
gap; none before the run ends: it never came back). From a run of policy=reuse_forecast with
`forecast_record=true` (`release_rows_from_log`): the policy's own log, for prefix-block replays
whose trace has no per-block release rows. Both build the same `ReleaseState` that the policy
builds live (policies/forecast_features.py), and `fit_table` turns rows into a survival table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.policies.forecast_features import (
    RATE_WINDOW_US,
    ReleaseState,
    bucket_values,
)
from cachepilot_sim.policies.forecast_model import SurvivalTable

NEVER = -1  # label of a release after which the entry was never used again
# Labels below NEVER: not used again before the observation stopped, c us after the release
# (a replay's training part ends while its blocks may still come back): -2 - c.
CENSORED = -2
Row = tuple[ReleaseState, int, int]  # (state, release time us, next gap us, NEVER or censored)


def censored(observed_us: int) -> int:
    """The label of a release watched for `observed_us` without a next use."""
    return CENSORED - max(observed_us, 0)


def release_rows_from_trace(trace: pl.DataFrame) -> list[Row]:
    """Every release of a session-workload run, in trace order, with its next gap."""
    t = trace.sort("t_us", "seq")
    arrive = t.filter(pl.col("kind") == "arrive").select(
        "request", tokens_in="value", class_index="class_index"
    )
    finish = (
        t.filter(pl.col("kind") == "finish")
        .select("t_us", "seq", "session", "request", generated="value")
        .join(arrive, on="request", how="left")
    )
    gaps = t.filter(pl.col("kind") == "reuse_gap").select("seq", "session", gap="value")
    f_t = finish["t_us"].to_numpy()
    # Releases in the window ending at each release, itself included (trace order = call order).
    recent = np.arange(len(f_t)) - np.searchsorted(f_t, f_t - RATE_WINDOW_US, side="right") + 1
    events: dict[int, list[tuple[int, int, int]]] = {}  # session -> (seq, kind 0 gap / 1 rel, i)
    for seq, session, gap in gaps.iter_rows():
        events.setdefault(session, []).append((seq, 0, gap))
    for i, (seq, session) in enumerate(zip(finish["seq"], finish["session"], strict=True)):
        events.setdefault(session, []).append((seq, 1, i))
    rows: list[Row | None] = [None] * finish.height
    f_rows = finish.rows(named=True)
    for session in sorted(events):
        seq_events = sorted(events[session])
        num_rel, last_gap, gap_sum, num_gaps = 0, -1, 0, 0
        pending: int | None = None  # the release waiting for its label
        for _, kind, v in seq_events:
            if kind == 0:
                if pending is not None:
                    state, t_rel, _ = rows[pending]  # type: ignore[misc]
                    rows[pending] = (state, t_rel, v)
                    pending = None
                last_gap, gap_sum, num_gaps = v, gap_sum + v, num_gaps + 1
                continue
            r = f_rows[v]
            num_rel += 1
            state = ReleaseState(
                class_index=int(r["class_index"]),
                num_releases=num_rel,
                # In the KV at the end: all but the last generated token (never fed back).
                num_tokens=int(r["tokens_in"]) + int(r["generated"]) - 1,
                last_gap_us=last_gap,
                gap_sum_us=gap_sum,
                num_gaps=num_gaps,
                recent_releases=int(recent[v]),
            )
            rows[v] = (state, int(r["t_us"]), NEVER)
            pending = v
    return [r for r in rows if r is not None]


def release_rows_from_log(
    releases: Sequence[tuple[int, int, ReleaseState]],
    accesses: Sequence[tuple[int, int]],
    end_us: int | None = None,
) -> list[Row]:
    """Rows from a policy's log: releases (entry id, t, state) and accesses (entry id, t); the
    label of a release is the time to the entry's next access after it; without one, NEVER, or
    censored at `end_us` when the run stopped before the workload did (a trace's first part)."""
    next_access: dict[int, list[int]] = {}
    for entry_id, t_us in accesses:
        next_access.setdefault(entry_id, []).append(t_us)
    rows: list[Row] = []
    for entry_id, t_us, state in releases:
        times = next_access.get(entry_id, [])
        k = int(np.searchsorted(times, t_us, side="right"))
        if k < len(times):
            rows.append((state, t_us, times[k] - t_us))
        else:
            rows.append((state, t_us, NEVER if end_us is None else censored(end_us - t_us)))
    return rows


_STATE_FIELDS = tuple(ReleaseState.__dataclass_fields__)


def save_rows(rows: Sequence[Row], path: Path) -> None:
    """Rows as Parquet (the state's fields, t_us, gap_us): other tables fit without re-running."""
    cols: dict[str, list[int]] = {f: [getattr(s, f) for s, _, _ in rows] for f in _STATE_FIELDS}
    cols |= {"t_us": [t for _, t, _ in rows], "gap_us": [g for _, _, g in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(cols, schema={k: pl.Int64 for k in cols}).write_parquet(path)


def load_rows(path: Path) -> list[Row]:
    """Rows written by `save_rows`; a file without those columns is a ValueError naming it."""
    frame = pl.read_parquet(path)
    missing = [c for c in (*_STATE_FIELDS, "t_us", "gap_us") if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a rows file, columns {missing} missing")
    return [
        (ReleaseState(*(int(r[f]) for f in _STATE_FIELDS)), int(r["t_us"]), int(r["gap_us"]))
        for r in frame.iter_rows(named=True)
    ]


def _survival(gaps: np.ndarray, grid_us: np.ndarray) -> np.ndarray:
    """Kaplan-Meier S on the grid: a NEVER release stays at risk for ever (S keeps its share),
    a censored one until it was last watched. Without censored rows it is the empirical S."""
    # Not scipy.stats.ecdf(CensoredData): one vectorized pass per bucket on a fixed grid here;
    # the same curve (tests/unit/test_reuse_forecast.py checks it against scipy).
    event = gaps >= 0
    dur = np.where(event, gaps, np.where(gaps == NEVER, np.iinfo(np.int64).max, CENSORED - gaps))
    order = np.lexsort((~event, dur))  # events before censorings at equal times
    dur, event = dur[order], event[order]
    at_risk = len(dur) - np.arange(len(dur))
    surv = np.cumprod(np.where(event, 1.0 - 1.0 / np.maximum(at_risk, 1), 1.0))
    idx = np.searchsorted(dur, grid_us, side="right")  # items with duration <= t
    return np.where(idx == 0, 1.0, surv[np.maximum(idx - 1, 0)])


def fit_table(
    rows: Sequence[Row],
    features: tuple[str, ...],
    grid: tuple[float, float, int],
    min_count: int,
    prior_weight: float,
    meta: dict[str, object],
) -> SurvivalTable:
    """Survival curve per bucket key and per key prefix; a bucket of n rows is shrunk towards
    its parent's curve with weight prior_weight / (n + prior_weight); buckets under min_count
    rows are left out (lookups back off to the parent). Deterministic: keys sorted."""
    if not rows:
        raise ValueError("no training rows: the runs released no cache entry")
    keys = [bucket_values(features, s) for s, _, _ in rows]
    gaps = np.array([g for _, _, g in rows], dtype=np.int64)
    table = SurvivalTable(features, grid, [()], np.ones((1, grid[2])))
    grid_us = table.grid_us()
    curves: dict[tuple[int, ...], np.ndarray] = {(): _survival(gaps, grid_us)}
    counts: dict[tuple[int, ...], int] = {(): len(gaps)}
    for level in range(1, len(features) + 1):
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(k[:level], []).append(i)
        for k in sorted(groups):
            idx = groups[k]
            parent = curves.get(k[:-1])
            if len(idx) < min_count or parent is None:
                continue
            raw = _survival(gaps[idx], grid_us)
            n = len(idx)
            curves[k] = (n * raw + prior_weight * parent) / (n + prior_weight)
            counts[k] = n
    ordered = sorted(curves, key=lambda k: (len(k), k))
    meta = {**meta, "bucket_rows": [counts[k] for k in ordered]}
    return SurvivalTable(features, grid, ordered, np.array([curves[k] for k in ordered]), meta)
