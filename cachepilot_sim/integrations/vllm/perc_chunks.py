"""PERC over vLLM's offloaded KV chunks, with no vLLM import: the logic behind PercCachePolicy.

A decision ranks the sessions that hold idle chunks by PERC's key, P(resume within delta) x
restore / bytes (the simulator's GapEstimator and PercPolicy formula). The key decays with idle
time, so no order can be kept between decisions; what is kept is each session's key inputs (last
use, gap EMA, idle restore cost, idle bytes) in arrays, updated only for the sessions that changed
since the previous decision. A decision is then PercPolicy.order's vectorised lines over those
arrays (C loops) instead of a CacheEntry per session gathered into NumPy one field at a time.
Linear in the sessions with idle chunks (at most the tier's chunk count), with a small constant:
policies/perc_index.py's sublinear index was measured slower at up to 16,000 sessions
(experiments/vllm_evictor/README.md).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

import numpy as np

from cachepilot_sim.integrations.vllm.chunks import Held, SessionChunkPolicy, _Session


class SessionArrays:
    """PERC's key inputs of the indexed sessions, one slot each (a removal moves the last slot
    into the hole; slot order is arbitrary, ties are broken by session id).

    Stored in `array.array`s, whose item assignment costs a list's, and read through NumPy views
    of the same memory (`views`), so that a decision's arithmetic runs in C.
    """

    __slots__ = ("num_slots", "cols", "views", "slot", "of")

    # last use (µs), gap EMA (µs, < 0: none yet), idle restore (µs), idle bytes, session id
    _TYPES: tuple[tuple[str, type], ...] = (("d", np.float64),) * 4 + (("q", np.int64),)

    def __init__(self, capacity: int = 64) -> None:
        self.num_slots = 0
        self.slot: dict[int, int] = {}  # session id -> slot
        self.of: list[_Session] = []  # slot -> session
        self.cols: list[array] = []
        self.views: list[np.ndarray] = []
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        old, n = self.cols, self.num_slots
        self.views = []  # release the old buffers before they are dropped
        self.cols = []
        for i, (code, dtype) in enumerate(self._TYPES):
            col = array(code, bytes(capacity * array(code).itemsize))
            if old:
                col[:n] = old[i][:n]
            self.cols.append(col)
            self.views.append(np.frombuffer(col, dtype=dtype))

    def put(self, session: _Session, cost_us: float, size: float) -> None:
        """Index `session` (or update its slot) with its entry's last use and gap EMA."""
        entry = session.entry
        slot = self.slot.get(entry.entry_id)
        cols = self.cols
        if slot is None:
            slot = self.num_slots
            if slot == len(cols[0]):
                self._allocate(2 * slot)
                cols = self.cols
            self.num_slots += 1
            self.slot[entry.entry_id] = slot
            self.of.append(session)
            cols[4][slot] = entry.entry_id
        cols[0][slot] = entry.last_used_us
        cols[1][slot] = entry.gap_ema_us
        cols[2][slot] = cost_us
        cols[3][slot] = size

    def drop(self, session_id: int) -> None:
        """Forget a session (no-op when absent)."""
        slot = self.slot.pop(session_id, None)
        if slot is None:
            return
        last = self.num_slots - 1
        moved = self.of.pop()
        if slot != last:
            for col in self.cols:
                col[slot] = col[last]
            self.of[slot] = moved
            self.slot[moved.entry.entry_id] = slot
        self.num_slots = last


class PercChunkPolicy(SessionChunkPolicy):
    """PERC (the simulator's GapEstimator and PercPolicy key), its sessions' key inputs kept in
    `SessionArrays`: the same victims as the full sort of SessionChunkPolicy, in the same order
    (tests/property/test_vllm_evict_properties.py)."""

    # Up to this many sessions a decision sorts them all (one lexsort); beyond, it takes one
    # minimum per victim session, as a decision takes ~1.5 of them (evictor benchmark).
    sort_up_to_sessions = 512

    def _reset(self) -> None:
        super()._reset()
        self.arrays = SessionArrays()

    def _flush(self) -> None:
        arrays, tpc = self.arrays, self.params.tokens_per_chunk
        for sid, session in self._changed.items():
            if session.num_evictable > 0:
                size = float(session.num_evictable * tpc)
                arrays.put(session, session.evictable_restore_us, size)
            else:
                arrays.drop(sid)
        self._changed.clear()

    def _ranked(self, now: int, held: Held) -> Iterator[_Session]:
        self._flush()
        arrays, tpc = self.arrays, self.params.tokens_per_chunk
        for sid, (count, restore) in held.items():
            # Ranked on their unprotected chunks for this decision only; re-put at the next.
            session = self._evictable_sessions[sid]
            self._changed[sid] = session
            if session.num_evictable > count:
                unheld_us = session.evictable_restore_us - restore
                arrays.put(session, unheld_us, float((session.num_evictable - count) * tpc))
            else:
                arrays.drop(sid)
        n = arrays.num_slots
        if n == 0:
            return
        last_used, gap, cost, size, ids = (v[:n] for v in arrays.views)
        # The lines of PercPolicy.order (the simulator's vectorised ranking) on these arrays: the
        # same keys to the bit, the same order (by key, then session id).
        idle = np.subtract(now, last_used)
        score = self.estimator.resume_probabilities(gap, idle) * cost / size
        if n <= self.sort_up_to_sessions:
            yield from self._in_order(np.lexsort((ids, score)).tolist())
            return
        for _ in range(n):  # many sessions, ~1.5 taken a decision: one O(n) minimum per victim
            ties = np.flatnonzero(score == score.min())
            slot = int(ties[0] if ties.shape[0] == 1 else ties[np.argmin(ids[ties])])
            score[slot] = np.inf  # taken: never the minimum again in this decision
            yield from self._in_order((slot,))

    def _in_order(self, slots: Iterable[int]) -> Iterator[_Session]:
        for slot in slots:
            session = self.arrays.of[slot]
            self._changed[session.entry.entry_id] = session  # what is left of it is re-put
            yield session
