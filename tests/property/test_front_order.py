"""FrontOrder pops exactly what a SortedList of the same items would, whatever the arrival order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from cachepilot_sim.policies.front_order import FrontOrder

# An op: add a key (a small int, so ties with the stamp deciding are common) or pop the minimum.
OPS = st.lists(st.one_of(st.integers(0, 50), st.none()), max_size=300)


@given(ops=OPS, start=st.lists(st.integers(0, 50), max_size=20))
@settings(max_examples=200, deadline=None)
def test_same_pops_as_a_sorted_list(ops: list[int | None], start: list[int]) -> None:
    items = [(k, i) for i, k in enumerate(start)]
    front, ref = FrontOrder(items), SortedList(items)
    stamp = len(items)
    for op in ops:
        if op is None:
            if ref:
                assert front.min() == ref[0]
                assert front.pop_min() == ref.pop(0)
            else:
                assert not front
        else:
            item = (op, stamp)
            stamp += 1
            front.add(item)
            ref.add(item)
        assert len(front) == len(ref)
        assert sorted(front) == list(ref)


def test_increasing_keys_never_reach_the_sorted_part() -> None:
    front = FrontOrder()
    for t in range(1000):
        front.add((t, t))
        if t % 3 == 0:
            front.pop_min()
    assert front.num_out_of_order == 0
    front.add((-1, -1))  # an old key: placed by bisection, and popped first
    assert front.num_out_of_order == 1 and front.pop_min() == (-1, -1)
