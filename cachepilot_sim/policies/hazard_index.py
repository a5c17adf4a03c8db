"""An exact index for perc_hazard's key: the smallest (P x restore / bytes, entry id).

P = 1 - S_c(t + δ) / S_c(t), t an entry's idle time, S_c the Kaplan-Meier curve of its workload
class c (`WindowSurvival.curve(now)`, `policies/hazard_curve.py`: it moves with now through
censoring, and with every release or return the policy sees). Each class is one row of
`ForecastIndex`'s blocks of contiguous last-use times (`policies/forecast_index.py`), whose
bookkeeping this reuses; only the queries differ. A KM curve is a cumulative product of factors in
[0, 1], so it is non-increasing in floating point too, and for t in a block's idle range [a, b],
P(t) >= 1 - S(a + δ) / S(b) exactly (correctly rounded division and subtraction are monotone): a
block's keys are bounded below by that times its smallest restore / bytes, less a relative ulp
margin.

Blocks hold about sqrt(n) / 16 entries (at least 8): narrower than reuse_forecast's, since a
block that spans more idle time than δ has a bound of 0.

A query (1) takes each class's curve once per (now, policy version, δ): every pop of one decision
shares it (`PercHazardPolicy.curve`), (2) bounds every block (a class's blocks in idle order: their
idle bounds are ascending, so the curve lookups of all of them are one `searchsorted` of the curve's
event times into them and a cumulative count, `count_at_most`), and flags the blocks with no event
time of their curve between their shortest idle and their longest idle + δ: all their keys are 0
exactly, and their smallest id (kept per block) is their best key, (3) keys every entry of the block
with the smallest bound, then of every block that can still win (a smaller bound, or the same bound
and a smaller smallest id: ties go to the smallest id, as the policy's key), with the policy's own
NumPy operations (`hazard_p`: the curve lookup is a `searchsorted` gather, no approximation), one
pass per class, and (4) computes the scalar key p x restore / bytes only for the entries whose p x
(restore / bytes) is within a relative ulp margin of the smallest (a 0 there is exactly 0). The
result is the full sort's first entry.

A class with no returned gap yet (no curve) is priced by the policy with the exponential EMA model
(`GapEstimator.resume_probability`: P = -expm1(-δ / max(base, idle, 1)), base the entry's gap EMA or
the population's), which is PERC's key: such a class's entries are also kept in a `PercIndex`
(`policies/perc_index.py`, its own per class, built at the first query that finds the class without
a curve and kept up to date from then on), whose smallest (key, id) is exact and keys few entries
(young entries by a time-independent order, dormant ones by branch and bound over last use). It keys
by the gap EMA it was given (the managers re-add an entry when it moves), not the entry's field now
(the prefix manager fills that in only for a decision). Its best key, computed here with the
policy's scalar operations, starts the bounded search over the other classes. A class's window keeps
its last `hazard_max_gaps` gaps, returned or not: a class that sees no return for that many releases
goes back to this path; a query that uses it is counted in `num_fallback`.

Cost per query otherwise: the curves (O(hazard_max_gaps) per class in NumPy, once per decision),
O(blocks) bounds in NumPy (a few vector operations per block, one binary search per event time),
and the entries of the blocks the bounds do not exclude (tests/property/test_hazard_index.py
counts them; experiments/bench_hazard_index.py times them).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from cachepilot_sim.policies.base import CacheEntry
from cachepilot_sim.policies.forecast_index import ForecastIndex, _Block
from cachepilot_sim.policies.perc_index import PercIndex
from cachepilot_sim.policies.reuse import GapEstimator


class HazardKey(Protocol):
    """What the index reads of perc_hazard (`PercHazardPolicy`; no import of it)."""

    version: int  # counts releases and returns: the curves at a time change with it
    estimator: GapEstimator

    def curve(self, class_index: int, now_us: int) -> tuple[np.ndarray, np.ndarray] | None: ...


_REL = 1e-15  # p * restore / bytes against p * (restore / bytes): a few roundings apart
HAZARD_BLOCK_ITEMS = 8  # a block's least size target
_TINY = 1e-290  # an absolute margin against underflow in those products


def survival_at(times: np.ndarray, surv: np.ndarray, t: np.ndarray) -> np.ndarray:
    """S at each of `t` from a KM curve (event times ascending, S just after each)."""
    idx = np.searchsorted(times, t, side="right")
    return np.where(idx == 0, 1.0, surv[np.maximum(idx - 1, 0)])


def count_at_most(times: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`np.searchsorted(times, x, side="right")` for `x` ascending, in O(len(x) + len(times) x
    log len(x)): the j-th of x has as many times at or below it as there are times t whose count
    of x below t (`side="left"`) is at most j."""
    below = np.searchsorted(x, times, side="left")
    return np.cumsum(np.bincount(below, minlength=len(x) + 1)[: len(x)])


def survival_from(surv: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`survival_at` from its `searchsorted` positions: one gather from [1, S...]."""
    return np.concatenate(([1.0], surv)).take(idx)


def hazard_p(times: np.ndarray, surv: np.ndarray, idle: np.ndarray, delta: float) -> np.ndarray:
    """P(resume within δ | idle) per entry: the policy's exact operations (`probabilities`)."""
    s_now = survival_at(times, surv, idle)
    s_later = survival_at(times, surv, idle + delta)
    return np.where(s_now > 0, 1.0 - s_later / np.maximum(s_now, 1e-300), 0.0)


Curves = dict[int, tuple[np.ndarray, np.ndarray] | None]


class HazardIndex(ForecastIndex):
    """perc_hazard's idle entries; `pop_min(now)` is the entry its sort would put first."""

    __slots__ = (
        "hazard",
        "num_fallback",
        "num_curves",
        "_gaps",
        "_ema",
        "_curves",
        "_curves_at",
        "_by_idle",
        "_zero",
        "_idmin",
    )

    def __init__(self, policy: HazardKey, block_items: int | None = None) -> None:
        super().__init__(policy, block_items)  # type: ignore[arg-type]  # only blocks are shared
        self.hazard = policy
        self.num_fallback = 0  # queries with a class on the EMA model (`PercIndex` per class)
        self.num_curves = 0  # class curves computed by queries (once per decision and class)
        self._gaps: dict[int, float] = {}  # id -> its gap EMA as added (< 0: none)
        self._ema: dict[int, PercIndex] = {}  # class -> its entries under the EMA model's key
        self._curves: Curves = {}
        self._curves_at: tuple[int, int, float] | None = None
        self._by_idle: dict[int, np.ndarray] = {}  # class -> its blocks' slots, newest first
        self._zero = np.zeros(0, dtype=bool)  # per slot: every key of the block is 0
        self._idmin = np.zeros(0, dtype=np.int64)  # per slot: its smallest id (-1: unknown)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate (`restore_us`) and gap EMA (< 0: none)
        stay as given while it is idle (the manager re-adds it when they change); its row is its
        workload class."""
        eid = entry.entry_id
        self.discard(eid)
        size = max(entry.num_bytes, 1)
        w = restore_us / size
        if not 0.0 <= w < np.inf:
            raise ValueError(f"HazardIndex.add: entry {eid} has weight {w}, need finite >= 0")
        self._gaps[eid] = float(gap_ema_us)
        self._insert(eid, entry.class_index, entry.last_used_us, w, restore_us, size)
        ema = self._ema.get(entry.class_index)
        if ema is not None:
            ema.add(eid, entry.last_used_us, gap_ema_us, restore_us, float(size))
        self._forget(self._items[eid][0].slot)
        self._bounds_at = None  # the bounds and zero flags are recomputed at the next query

    def _split(self, row: int, k: int) -> None:
        """`ForecastIndex._split`, forgetting the two blocks' smallest ids."""
        super()._split(row, k)
        for b in self._blocks[row][k : k + 2]:
            self._forget(b.slot)
        self._by_idle.pop(row, None)

    def _drop_block(self, row: int, b: _Block) -> None:
        """`ForecastIndex._drop_block`, forgetting the row's block order."""
        super()._drop_block(row, b)
        self._by_idle.pop(row, None)

    def _class_slots(self, c: int) -> np.ndarray:
        """Class c's blocks' slots by idle time ascending (last use descending: their ranges
        of last use do not overlap), so their idle bounds are ascending for `count_at_most`."""
        order = self._by_idle.get(c)
        if order is None:
            blocks = self._blocks[c]
            order = self._by_idle[c] = np.fromiter(
                (b.slot for b in reversed(blocks)), dtype=np.int64, count=len(blocks)
            )
        return order

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        self._gaps.pop(entry_id, None)
        item = self._items.get(entry_id)
        if item is not None:
            self._forget(item[0].slot)
            ema = self._ema.get(item[2])
            if ema is not None:
                ema.discard(entry_id)
        super().discard(entry_id)

    def _class_curves(self, now_us: int) -> Curves:
        """Each indexed class's curve at `now_us`, computed once per (now, version, δ)."""
        policy = self.hazard
        at = (now_us, policy.version, float(policy.estimator.delta_us))
        if self._curves_at != at:
            self._curves = {}
            self._curves_at = at
        for c in self._blocks:
            if c not in self._curves:
                self._curves[c] = policy.curve(c, now_us)
                self.num_curves += 1
        return self._curves

    def _hazard_bounds(self, now_us: int, curves: Curves) -> tuple[np.ndarray, np.ndarray]:
        """Per slot, a lower bound of the keys of its items at `now_us` (inf: a free slot), and
        whether every key of the block is 0 (no event time of its curve between its shortest
        idle and its longest idle + δ: S(t) = S(t + δ), P = 0 exactly). Cached per (now,
        version, δ) until an add."""
        at = (now_us, self.hazard.version, float(self.hazard.estimator.delta_us))
        if self._bounds is not None and self._bounds_at == at:  # type: ignore[comparison-overlap]
            return self._bounds, self._zero
        delta = self.hazard.estimator.delta_us
        bounds = np.full(len(self._wmin), np.inf)
        zero = np.zeros(len(self._wmin), dtype=bool)
        for c in self._blocks:
            curve = curves[c]
            if curve is None:  # the EMA model's class: keyed apart (`_ema_min`), never bounded
                continue
            times, surv = curve
            sel = self._class_slots(c)
            t_far = now_us - self._lo[sel]  # longest idle in the block (ascending over sel)
            t_short = now_us - self._hi[sel]  # shortest idle (ascending too)
            s_far = survival_from(surv, count_at_most(times, t_far))
            s_near = survival_from(surv, count_at_most(times, t_short + delta))
            p_lo = np.where(s_far > 0, 1.0 - s_near / np.maximum(s_far, 1e-300), 0.0)
            low = np.maximum(p_lo, 0.0) * self._wmin[sel] * (1.0 - _REL) - _TINY
            bounds[sel] = np.maximum(low, 0.0)
            # No event time in (shortest idle, longest idle + δ]: S(t) = S(t + δ) throughout.
            first = count_at_most(times, t_short)
            zero[sel] = first == count_at_most(times, t_far + delta)
        self._bounds, self._bounds_at, self._zero = bounds, at, zero  # type: ignore[assignment]
        return bounds, zero

    def _min_ids(self, slots: np.ndarray) -> np.ndarray:
        """The smallest id in each block at `slots` (kept until the block changes)."""
        ids = self._idmin
        for s in slots[ids[slots] < 0].tolist():
            b = self._slot_block[s]
            assert b is not None
            ids[s] = b.ids[: b.n].min()
        return ids[slots]

    def _forget(self, slot: int) -> None:
        if slot < len(self._idmin):
            self._idmin[slot] = -1

    def _target(self) -> int:
        """Items per block: `block_items` when given, else sqrt(n) / 16 and at least 8. Narrower
        than reuse_forecast's: a block's bound is 0 once it spans more idle time than δ, and a
        query's bounds (O(blocks), vectorised) cost less than its scans."""
        if self.block_items is not None:
            return self.block_items
        return max(HAZARD_BLOCK_ITEMS, math.isqrt(len(self._items)) // 16)

    def _new_block(self, row: int) -> _Block:
        """`ForecastIndex._new_block`, with a slot in the smallest-id array."""
        b = super()._new_block(row)
        if len(self._idmin) < len(self._wmin):
            grow = len(self._wmin) - len(self._idmin)
            self._idmin = np.concatenate([self._idmin, np.full(grow, -1, dtype=np.int64)])
        self._idmin[b.slot] = -1
        return b

    def _hazard_scan(
        self, slots: list[int], now_us: int, curves: Curves, best: tuple[float, int] | None
    ) -> tuple[float, int] | None:
        """The smallest (key, id) among `best` and the items of the blocks in `slots`."""
        delta = self.hazard.estimator.delta_us
        by_row: dict[int, list[_Block]] = {}
        for s in slots:
            b = self._slot_block[s]
            if b is not None:
                by_row.setdefault(b.row, []).append(b)
        ps: list[np.ndarray] = []
        ws: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        for row, blocks in by_row.items():  # one NumPy pass per class
            curve = curves[row]
            assert curve is not None
            last = np.concatenate([b.last[: b.n] for b in blocks])
            # The policy's idle: an int difference, then float64 (exact below 2^53 us).
            idle = (now_us - last.astype(np.int64)).astype(np.float64)
            ps.append(hazard_p(*curve, idle, delta))
            ws.extend(b.w[: b.n] for b in blocks)
            ids.extend(b.ids[: b.n] for b in blocks)
        if not ids:
            return best
        p, w, ii = np.concatenate(ps), np.concatenate(ws), np.concatenate(ids)
        self.num_approx += len(ii)
        approx = p * w
        zero = approx == 0.0  # p = 0 or restore = 0: the exact key is 0 too
        if zero.any():
            cand = (0.0, int(ii[zero].min()))
            if best is None or cand < best:
                best = cand
        pos = ~zero
        if not pos.any():
            return best
        cap = float(approx[pos].min()) * (1.0 + _REL) + _TINY
        if best is not None:
            cap = min(cap, best[0] * (1.0 + _REL) + _TINY)
        for j in np.flatnonzero(pos & (approx <= cap)).tolist():
            eid = int(ii[j])
            _, _, _, _, restore, size = self._items[eid]
            self.num_keyed += 1
            key = float(p[j] * restore / size)  # as `PercHazardPolicy.order` and `key`
            if best is None or (key, eid) < best:
                best = (key, eid)
        return best

    def _ema_index(self, c: int, now_us: int) -> PercIndex:
        """Class c's `PercIndex`, built from its blocks at its first use (or when δ moved, or
        time went back: PercIndex moves items from young to dormant once), then kept by `add`
        and `discard`."""
        delta = float(self.hazard.estimator.delta_us)
        ema = self._ema.get(c)
        last = None if ema is None else ema._last_now
        if ema is None or ema.delta_us != delta or (last is not None and now_us < last):
            ema = self._ema[c] = PercIndex(delta)
            ema.advance(now_us)  # the long idle go straight to the dormant order
            for b in self._blocks[c]:
                for eid in b.ids[: b.n].tolist():
                    _, _, _, last_us, restore, size = self._items[eid]
                    ema.add(eid, last_us, self._gaps[eid], restore, float(size))
        return ema

    def _ema_min(self, classes: list[int], now_us: int) -> tuple[float, int]:
        """The smallest (key, id) among the classes without a curve: each class's `PercIndex`
        gives its own, keyed here as the policy keys it (`GapEstimator.resume_probability`,
        then p * restore / size)."""
        self.num_fallback += 1
        estimator = self.hazard.estimator
        population = estimator.population_gap_us
        best: tuple[float, int] | None = None
        for c in classes:
            eid = self._ema_index(c, now_us).peek_min(now_us, population)
            assert eid is not None  # a class has blocks only while it has entries
            _, _, _, last, restore, size = self._items[eid]
            gap = self._gaps[eid]
            base = gap if gap >= 0 else population
            p = -math.expm1(-estimator.delta_us / max(base, float(now_us - last), 1.0))
            cand = (p * restore / size, eid)
            if best is None or cand < best:
                best = cand
        assert best is not None
        return best

    def num_ema_keyed(self) -> int:
        """Entries keyed by the EMA classes' `PercIndex` queries (a complexity probe)."""
        return sum(ema.num_keyed for ema in self._ema.values())

    def peek_min(self, now_us: int) -> int | None:
        """The id of the entry with the smallest (key, id) at `now_us`, or None."""
        if not self._items:
            return None
        curves = self._class_curves(now_us)
        best: tuple[float, int] | None = None
        missing = [c for c in self._blocks if curves[c] is None]
        if missing:  # keyed entry by entry; the other classes' blocks are bounded as usual
            best = self._ema_min(missing, now_us)
            if len(missing) == len(self._blocks):
                return best[1]
        bounds, zero = self._hazard_bounds(now_us, curves)
        zero = zero & (bounds < np.inf)  # a block emptied since is free (its bound is inf)
        if zero.any():  # blocks whose keys are all 0: their smallest id, unscanned
            cand = (0.0, int(self._min_ids(np.flatnonzero(zero)).min()))
            if best is None or cand < best:
                best = cand
        if best is None:
            first = int(np.argmin(bounds))
            best = self._hazard_scan([first], now_us, curves, None)
            assert best is not None
            bounds = bounds.copy()
            bounds[first] = np.inf
        key, eid = best
        # A block can still win with a smaller key, or the same key and a smaller id.
        more = np.flatnonzero(~zero & (bounds <= key))
        more = more[(bounds[more] < key) | (self._min_ids(more) < eid)]
        found = self._hazard_scan(more.tolist(), now_us, curves, best)
        assert found is not None
        return found[1]
