"""What a cache can know about an idle entry when it is released, as the forecast's bucket key.

One pure function (`bucket_values`) maps the raw state of a release (class, releases so far,
context tokens, the entry's earlier idle gaps, how many releases happened in the last minute) to
small integers; training (tools/train_forecast.py, from the event trace) and the policy at decision
time (`ReleaseTracker`, from the CacheEntry and the hooks) call it alike, so a feature cannot mean
one thing offline and another online (tests/unit/test_reuse_forecast.py checks both give the same
values for the same release). Nothing here depends on the time of the decision: the key is
computed once per release and cached per entry.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Every feature a model may use, in the order a bucket key is cut back when its bucket is sparse
# (the last feature of a model's list is dropped first).
FEATURES = ("class", "tokens", "turn", "last_gap", "mean_gap", "rate")
# Releases counted for "rate": those in the last RATE_WINDOW_US, this one included.
RATE_WINDOW_US = 60_000_000
_GAP_EDGES_S = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0)
_RATE_EDGES = (2, 5, 10, 20, 40)
_MAX_TURN = 6
_TOKENS_LOG2 = (7, 15)  # context tokens bucketed by log2, clipped to [128, 32k]


@dataclass(frozen=True, slots=True)
class ReleaseState:
    """The raw facts at one release: a turn ended (or a block's last user finished)."""

    class_index: int
    num_releases: int  # releases of this entry so far, this one included (1 at the first)
    num_tokens: int  # tokens the entry holds
    last_gap_us: int  # the entry's most recent observed idle gap; -1 before any
    gap_sum_us: int  # sum of its observed idle gaps
    num_gaps: int
    recent_releases: int  # releases of any entry in the last RATE_WINDOW_US, this one included


def _bin(value: float, edges: tuple[float, ...]) -> int:
    return sum(1 for e in edges if value >= e)


def feature_value(name: str, s: ReleaseState) -> int:
    """One feature of a release as a small integer (-1: unknown, e.g. no gap seen yet)."""
    if name == "class":
        return s.class_index
    if name == "tokens":
        lo, hi = _TOKENS_LOG2
        return min(max(int(math.log2(max(s.num_tokens, 1))), lo), hi) - lo
    if name == "turn":
        return min(s.num_releases, _MAX_TURN)
    if name == "last_gap":
        return -1 if s.last_gap_us < 0 else _bin(s.last_gap_us / 1e6, _GAP_EDGES_S)
    if name == "mean_gap":
        return -1 if s.num_gaps == 0 else _bin(s.gap_sum_us / s.num_gaps / 1e6, _GAP_EDGES_S)
    if name == "rate":
        return _bin(s.recent_releases, _RATE_EDGES)
    raise ValueError(f"unknown forecast feature {name!r}; known: {', '.join(FEATURES)}")


def bucket_values(features: tuple[str, ...], s: ReleaseState) -> tuple[int, ...]:
    """The bucket key of a release for a model that reads `features` (in that order)."""
    return tuple(feature_value(f, s) for f in features)


class ReleaseTracker:
    """The per-entry history the features need, kept from the policy hooks alone.

    `release` returns the state at a release; `access` records the idle gap that just ended
    (now - entry.last_used_us, exactly the `reuse_gap` row's value). O(1) amortized per hook.
    """

    __slots__ = ("num_releases", "last_gap_us", "gap_sum_us", "num_gaps", "_recent")

    def __init__(self) -> None:
        self.num_releases: dict[int, int] = {}
        self.last_gap_us: dict[int, int] = {}
        self.gap_sum_us: dict[int, int] = {}
        self.num_gaps: dict[int, int] = {}
        self._recent: deque[int] = deque()

    def access(self, entry_id: int, gap_us: int) -> None:
        """The entry was used again after an idle gap of `gap_us`."""
        self.last_gap_us[entry_id] = gap_us
        self.gap_sum_us[entry_id] = self.gap_sum_us.get(entry_id, 0) + gap_us
        self.num_gaps[entry_id] = self.num_gaps.get(entry_id, 0) + 1

    def release(
        self, entry_id: int, class_index: int, num_tokens: int, now_us: int
    ) -> ReleaseState:
        """The entry became idle now: count the release and return its state."""
        n = self.num_releases.get(entry_id, 0) + 1
        self.num_releases[entry_id] = n
        recent = self._recent
        recent.append(now_us)
        while recent[0] <= now_us - RATE_WINDOW_US:
            recent.popleft()
        return ReleaseState(
            class_index=class_index,
            num_releases=n,
            num_tokens=num_tokens,
            last_gap_us=self.last_gap_us.get(entry_id, -1),
            gap_sum_us=self.gap_sum_us.get(entry_id, 0),
            num_gaps=self.num_gaps.get(entry_id, 0),
            recent_releases=len(recent),
        )
