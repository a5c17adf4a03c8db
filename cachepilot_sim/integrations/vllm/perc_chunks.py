"""PERC over vLLM's offloaded KV chunks, with no vLLM import: the logic behind PercCachePolicy.

A decision ranks the sessions that hold idle chunks by PERC's key, P(resume within delta) x
restore / bytes (the simulator's GapEstimator and PercPolicy formula). The key decays with idle
time, so no order can be kept between decisions; what is kept is each session's key inputs (last
use, base gap, idle restore cost, idle bytes) in arrays, updated only for the sessions that changed
since the previous decision. A decision then computes every key with the arithmetic of
PercPolicy.order (in Python below `vectorise_from` sessions, else six NumPy calls over the arrays)
and takes the sessions one maximum of the negated key at a time, since a decision takes ~1.5 of
them. Linear in the sessions with idle chunks (at most the tier's chunk count), with a small
constant: policies/perc_index.py's sublinear index was measured slower at up to 16,000 sessions
(experiments/vllm_evictor/README.md).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator

import numpy as np

from cachepilot_sim.integrations.vllm.chunks import Held, SessionChunkPolicy, _Session

# A negated key no ranked session has (keys are finite and >= 0): taken, excluded or padding.
_TAKEN = -math.inf


class SessionArrays:
    """PERC's key inputs of the indexed sessions, one slot each, kept on the session (a removal
    moves another slot into the hole; slot order is arbitrary, ties are broken by session id).

    Stored in `array.array`s, whose item assignment costs a list's, and read through NumPy views
    of the same memory (`views`), so that a decision's arithmetic runs in C. The base gap is
    max(own gap EMA, 1), or for a session without one max(population EMA, 1) as of the last
    `refresh_population`; those sessions hold the first `num_without_gap` slots, so that a moved
    population EMA is one fill.
    """

    __slots__ = (
        "num_slots",
        "num_without_gap",
        "cols",
        "views",
        "of",
        "scratch",
        "population_base",
        "_windows",
    )

    # last use (µs), base gap (µs), idle restore (µs), idle bytes, session id
    _TYPES: tuple[tuple[str, type], ...] = (("d", np.float64),) * 4 + (("q", np.int64),)
    # A slot past the last holds inputs whose negated key is -inf, so that a decision computes
    # over a power-of-two window of slots without slicing to the count: restore +inf is enough
    # (a finite gap >= 1 gives -P < 0 for any delta above 1e-290 µs, times +inf), the rest are
    # a fresh slot's safe values.
    _PAD: tuple[float | int, ...] = (math.inf, 1.0, math.inf, 1.0, -1)

    def __init__(self, capacity: int = 64) -> None:
        self.num_slots = 0
        self.num_without_gap = 0
        self.of: list[_Session] = []  # slot -> session
        self.cols: list[array] = []
        self.views: list[np.ndarray] = []
        self.population_base = 1.0
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        old, n = self.cols, self.num_slots
        self.views = []  # release the old buffers before they are dropped
        self.cols = []
        for i, (code, dtype) in enumerate(self._TYPES):
            col = array(code, [self._PAD[i]]) * capacity
            if old:
                col[:n] = old[i][:n]
            self.cols.append(col)
            self.views.append(np.frombuffer(col, dtype=dtype))
        self.scratch = np.empty(capacity, dtype=np.float64)  # a decision's keys
        self._windows: dict[int, list[np.ndarray]] = {}

    def window(self) -> list[np.ndarray]:
        """The views and the scratch over the first 2^k >= num_slots slots (at least 64)."""
        n = self.num_slots
        width = 64 if n <= 64 else 1 << (n - 1).bit_length()
        views = self._windows.get(width)
        if views is None:
            views = self._windows[width] = [v[:width] for v in (*self.views, self.scratch)]
        return views

    def refresh_population(self, population_gap_us: float) -> None:
        """Rewrite the base gap of the sessions without a gap EMA of their own when the
        population's has moved."""
        base = population_gap_us if population_gap_us > 1.0 else 1.0
        if base != self.population_base:
            self.population_base = base
            if self.num_without_gap:  # array slice assignment: cheaper than a NumPy call
                self.cols[1][: self.num_without_gap] = array("d", (base,)) * self.num_without_gap

    def _move(self, src: int, dst: int) -> None:
        """Slot `src`'s session and inputs into slot `dst` (whose contents are overwritten)."""
        for col in self.cols:
            col[dst] = col[src]
        session = self.of[dst] = self.of[src]
        session.slot = dst

    def put(self, session: _Session, cost_us: float, size: float) -> None:
        """Index `session` (or update its slot) with its entry's last use and gap EMA."""
        entry, slot, cols = session.entry, session.slot, self.cols
        gap = entry.gap_ema_us
        if slot < 0:
            slot = self.num_slots
            if slot == len(cols[0]):
                self._allocate(2 * slot)
                cols = self.cols
            self.num_slots += 1
            self.of.append(session)
            if gap < 0:  # into the prefix: the first slot after it moves to the end
                first = self.num_without_gap
                self.num_without_gap = first + 1
                if first != slot:
                    self._move(first, slot)
                    self.of[first] = session
                    slot = first
            session.slot = slot
            cols[4][slot] = entry.entry_id
        elif gap >= 0 and slot < self.num_without_gap:  # learned its first gap: out of the prefix
            last = self.num_without_gap - 1
            self.num_without_gap = last
            if slot != last:
                self._move(last, slot)
                self.of[last] = session
                session.slot = slot = last
                cols[4][slot] = entry.entry_id
        cols[0][slot] = entry.last_used_us
        cols[1][slot] = self.population_base if gap < 0 else gap if gap > 1.0 else 1.0
        cols[2][slot] = cost_us
        cols[3][slot] = size

    def exclude(self, session: _Session) -> None:
        """Keep the session's slot out of this decision: restore +inf, a -inf negated key (the
        next `put` restores it)."""
        self.cols[2][session.slot] = math.inf

    def drop(self, session: _Session) -> None:
        """Forget a session (no-op when absent)."""
        slot = session.slot
        if slot < 0:
            return
        session.slot = -1
        if slot < self.num_without_gap:  # the prefix's last slot fills the hole, the hole moves
            last = self.num_without_gap - 1
            self.num_without_gap = last
            if slot != last:
                self._move(last, slot)
            slot = last
        last = self.num_slots - 1
        if slot != last:
            self._move(last, slot)
        self.cols[2][last] = math.inf  # the padding's restore: a -inf negated key (see _PAD)
        self.of.pop()
        self.num_slots = last

    def negated_keys(self, now_us: int, delta_us: float) -> tuple[np.ndarray, np.ndarray]:
        """-key of every slot of the window (-inf past the last), computed as PercPolicy.order
        computes the key, then negated: IEEE products and quotients are sign-symmetric, so these
        are the keys' exact negatives; and the window's session ids."""
        last_used, base, cost, size, ids, out = self.window()
        np.subtract(now_us, last_used, out=out)  # idle
        np.maximum(out, base, out=out)  # gap = max(base, idle, 1): base holds the 1
        np.divide(-delta_us, out, out=out)
        np.expm1(out, out=out)  # -P(resume within delta)
        np.multiply(out, cost, out=out)
        np.divide(out, size, out=out)
        return out, ids

    def keys(self, now_us: int, delta_us: float) -> list[tuple[float, int, int]]:
        """(key, session id, slot) of every slot, computed as PercPolicy.score computes it."""
        n = self.num_slots
        last_used, base, cost, size, ids = (c[:n] for c in self.cols[:5])
        expm1, now, neg_delta = math.expm1, float(now_us), -delta_us
        return [
            (-expm1(neg_delta / (b if b >= (idle := now - u) else idle)) * c / s, i, slot)
            for slot, (u, b, c, s, i) in enumerate(
                zip(last_used, base, cost, size, ids, strict=True)
            )
        ]


class PercChunkPolicy(SessionChunkPolicy):
    """PERC (the simulator's GapEstimator and PercPolicy key), its sessions' key inputs kept in
    `SessionArrays`: the same victims as the full sort of SessionChunkPolicy, in the same order
    (tests/property/test_vllm_evict_properties.py)."""

    # Below this many sessions keys are computed in Python, from it on with NumPy. PercPolicy.order
    # switches at the same count (_VECTORISE_FROM), so that both use the same expm1 (math's, then
    # NumPy's) on any host; the measured crossover is lower, ~16 sessions on the benchmark host
    # (experiments/vllm_evictor/key_paths.py): 16-31 sessions pay up to ~15 µs for that.
    vectorise_from = 32
    # On the NumPy side a decision takes one maximum per session it evicts from (~1.5 a decision
    # in the benchmark); past this many it sorts the rest at once.
    sort_after_picks = 8

    def _reset(self) -> None:
        super()._reset()
        self.arrays = SessionArrays()

    def _flush(self) -> None:
        arrays, tpc = self.arrays, self.params.tokens_per_chunk
        arrays.refresh_population(self.estimator.population_gap_us)
        for session in self._changed.values():
            if session.num_evictable > 0:
                arrays.put(
                    session, session.evictable_restore_us, float(session.num_evictable * tpc)
                )
            else:
                arrays.drop(session)
        self._changed.clear()

    def _ranked(self, now: int, held: Held) -> Iterator[_Session]:
        self._flush()
        arrays, tpc = self.arrays, self.params.tokens_per_chunk
        num_excluded = 0
        for sid, (count, restore) in held.items():
            # Ranked on their unprotected chunks for this decision only; re-put at the next.
            session = self._evictable_sessions[sid]
            self._changed[sid] = session
            if session.num_evictable > count:
                unheld_us = session.evictable_restore_us - restore
                arrays.put(session, unheld_us, float((session.num_evictable - count) * tpc))
            else:  # all protected: ranked last (+inf), never reached (evict counted the chunks)
                arrays.exclude(session)
                num_excluded += 1
        of = arrays.of
        # PercPolicy.order's switch, on the sessions it would rank (those with a key < +inf).
        if arrays.num_slots - num_excluded < self.vectorise_from:
            keyed = arrays.keys(now, self.estimator.delta_us)
            keyed.sort()  # by key, then session id (unique: the slot is never compared)
            for _, _, slot in keyed:
                yield of[slot]
            return
        # The rest, one maximum of the negated key at a time (its first slot; the other slots
        # holding the same value ordered by id), `sort_after_picks` times, then sorted.
        neg, ids = arrays.negated_keys(now, self.estimator.delta_us)
        value = neg.item  # a Python float: cheaper to compare than a NumPy scalar
        slot = int(neg.argmax())
        for _ in range(self.sort_after_picks):
            top = value(slot)
            if top == _TAKEN:
                return
            neg[slot] = _TAKEN
            after = int(neg.argmax())  # the next maximum; also tells whether `top` is tied
            if value(after) != top:
                yield of[slot]
            else:  # exact ties: by session id, as the sort breaks them
                tied = np.append(np.flatnonzero(neg == top), slot)
                neg[tied] = _TAKEN
                for tie in tied[np.argsort(ids[tied])].tolist():
                    yield of[tie]
                after = int(neg.argmax())
            slot = after
        rest = np.flatnonzero(neg != _TAKEN)
        for slot in rest[np.lexsort((ids[rest], np.negative(neg[rest])))].tolist():
            yield of[slot]
