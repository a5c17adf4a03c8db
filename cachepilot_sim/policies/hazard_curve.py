"""perc_hazard's Kaplan-Meier curve per workload class, kept up to date as gaps come and go.

`SurvivalEstimate` (`policies/perc_variants.py`) builds the curve from its window of gap records
at every call: an array of the records, a lexsort by (duration, censored last), a cumulative
product. `WindowSurvival` keeps the same window and, beside it, the returned gaps' durations and
the open gaps' release times in sorted lists, so a curve at `now` needs no sort: an open gap is a
censored duration now - release, and the k-th smallest returned gap d (k from 0) sorts after
k events and after the open gaps whose censored duration is below d, that is whose release is
after now - d (a `searchsorted`). Its number at risk is the window's size less that position, the
factor 1 - 1 / at risk as `SurvivalEstimate` computes it, and the cumulative product over the
events alone is the same float sequence (a censoring's factor is 1.0: multiplying by it is
exact). tests/property/test_hazard_index.py checks the curves equal bit for bit on random
streams. Cost: O(window) NumPy per curve, plus an O(window) copy of a sorted list after a change.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from sortedcontainers import SortedList


class WindowSurvival:
    """`SurvivalEstimate` (same window, same curve floats) without a sort per curve."""

    __slots__ = (
        "max_subjects",
        "released",
        "open_gap",
        "_next_gap",
        "_events",
        "_opens",
        "_arrays",
        "num_builds",
    )

    def __init__(self, max_subjects: int) -> None:
        self.max_subjects = max_subjects
        # As `SurvivalEstimate`: gap id -> [release_us, gap_us or -1], oldest first.
        self.released: OrderedDict[int, list[int]] = OrderedDict()
        self.open_gap: dict[int, int] = {}  # entry -> id of its gap in progress
        self._next_gap = 0
        self._events: SortedList = SortedList()  # durations of the returned gaps in the window
        self._opens: SortedList = SortedList()  # release times of the open gaps in the window
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # the two, as arrays
        self.num_builds = 0  # copies of the sorted lists to arrays (a complexity probe)

    def release(self, entry_id: int, now_us: int) -> None:
        """The entry went idle: a gap opens; the oldest record leaves a full window."""
        self.open_gap[entry_id] = self._next_gap
        self.released[self._next_gap] = [now_us, -1]
        self._opens.add(now_us)
        self._next_gap += 1
        while len(self.released) > self.max_subjects:
            _, (start, gap) = self.released.popitem(last=False)
            if gap < 0:
                self._opens.remove(start)
            else:
                self._events.remove(gap)
        self._arrays = None

    def returned(self, entry_id: int, now_us: int) -> None:
        """The entry came back: its gap, if still in the window, is observed."""
        rec = self.released.get(self.open_gap.pop(entry_id, -1))
        if rec is not None and rec[1] < 0:
            rec[1] = now_us - rec[0]
            if rec[1] >= 0:  # (a negative gap stays censored, as `SurvivalEstimate` has it)
                self._opens.remove(rec[0])
                self._events.add(rec[1])
                self._arrays = None

    def curve(self, now_us: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Event times (ascending) and S just after each; None without any returned gap."""
        if not self._events:
            return None
        if self._arrays is None:
            self.num_builds += 1
            events = np.fromiter(self._events, dtype=np.int64, count=len(self._events))
            opens = np.fromiter(self._opens, dtype=np.int64, count=len(self._opens))
            self._arrays = (events, opens)
        events, opens = self._arrays
        # Censorings before the k-th event: open gaps with now - release < d, release > now - d.
        before = len(opens) - np.searchsorted(opens, now_us - events, side="right")
        at_risk = len(self.released) - (np.arange(len(events)) + before)
        surv = np.cumprod(1.0 - 1.0 / at_risk)
        times = events.astype(np.float64)
        last = np.append(times[1:] != times[:-1], True)  # one point per distinct event time
        return times[last], surv[last]
