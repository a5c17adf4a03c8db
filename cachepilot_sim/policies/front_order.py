"""An ordered multiset for eviction candidates that arrive mostly in increasing order.

Recency keys (LRU's last use, a FIFO's time of entry) grow with the clock: an entry that goes idle
now has a larger key than every idle entry before it. A `SortedList` places each such key by
bisection and, at 10^6 items, walks tuples spread over memory to do it; popping its front is
cheap. `FrontOrder` keeps the keys that arrive in increasing order in a deque (append and pop at
the ends: O(1), touching only the ends) and the others in a `SortedList`; the smallest item is the
smaller of the two fronts. Exactly the order of one `SortedList` of the same items: only the cost
changes (`tests/property/test_front_order.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

from sortedcontainers import SortedList


class FrontOrder:
    """Items (comparable, distinct) with `add`, `pop_min` and `min`; iteration is unordered."""

    __slots__ = ("_run", "_rest")

    def __init__(self, items: Iterable[Any] = ()) -> None:
        self._run: deque[Any] = deque(sorted(items))  # increasing
        self._rest: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._run) + len(self._rest)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._rest)

    def __iter__(self) -> Iterator[Any]:
        return chain(self._run, self._rest)

    @property
    def num_out_of_order(self) -> int:
        """Items kept in the sorted part (arrived below the run's last item): a probe for tests."""
        return len(self._rest)

    def add(self, item: Any) -> None:
        """Insert `item`: O(1) when it is larger than every item added to the run so far."""
        run = self._run
        if not run or item > run[-1]:
            run.append(item)
        else:
            self._rest.add(item)

    def min(self) -> Any:
        """The smallest item (IndexError when empty)."""
        run, rest = self._run, self._rest
        if rest and (not run or rest[0] < run[0]):
            return rest[0]
        return run[0]

    def pop_min(self) -> Any:
        """Remove and return the smallest item (IndexError when empty)."""
        run, rest = self._run, self._rest
        if rest and (not run or rest[0] < run[0]):
            return rest.pop(0)
        return run.popleft()
