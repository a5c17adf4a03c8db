"""SIEVE and S3-FIFO as keys: on unit-size entries that are idle between accesses, the victims of
their keys are those of the queue algorithms written literally from the papers (SIEVE, NSDI'24,
Algorithm 1; S3-FIFO, SOSP'23, Algorithm 1 / libCacheSim S3FIFOv0.c), and their defining
properties hold: a visited entry survives one pass of SIEVE's hand; S3-FIFO's one-hit entries
leave through the small queue."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.s3fifo import S3FifoPolicy
from cachepilot_sim.policies.sieve import SievePolicy

# An op is an access to entry 0..11 (a hit or a miss) or, as -1, one eviction.
ops_strategy = st.lists(st.integers(-1, 11), min_size=1, max_size=120)


class LiteralSieve:
    """SIEVE as the paper states it: a FIFO list (index 0 the tail, the oldest), visited bits and
    a hand that survives evictions; at the head's end it wraps to the tail."""

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.visited: dict[int, bool] = {}
        self.hand: int | None = None  # an object id, or None: start at the tail

    def access(self, x: int) -> None:
        if x in self.visited:
            self.visited[x] = True
        else:
            self.queue.append(x)
            self.visited[x] = False

    def evict(self) -> int:
        i = self.queue.index(self.hand) if self.hand is not None else 0
        while self.visited[self.queue[i]]:
            self.visited[self.queue[i]] = False
            i = (i + 1) % len(self.queue)
        victim = self.queue[i]
        self.hand = self.queue[i + 1] if i + 1 < len(self.queue) else None
        self.queue.pop(i)
        del self.visited[victim]
        return victim


class LiteralS3Fifo:
    """S3-FIFO as libCacheSim's S3FIFOv0.c runs it, for unit sizes and a fixed capacity."""

    def __init__(self, capacity: int, small_fraction: float = 0.1, threshold: int = 1) -> None:
        self.capacity = capacity
        self.main_size = capacity - int(small_fraction * capacity + 0.5)
        self.small_fraction = small_fraction
        self.threshold = threshold
        self.small: OrderedDict[int, int] = OrderedDict()
        self.main: OrderedDict[int, int] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.left_through: dict[int, str] = {}

    def access(self, x: int) -> None:
        for q in (self.small, self.main):
            if x in q:
                q[x] += 1
                return
        if x in self.ghost:
            del self.ghost[x]
            self.main[x] = 0
        else:
            self.small[x] = 0

    def evict(self) -> int:
        main_limit = (1 - self.small_fraction) * self.capacity
        while True:
            if self.main and (len(self.main) > main_limit or not self.small):
                x, freq = self.main.popitem(last=False)
                if freq > 0:
                    self.main[x] = min(freq, 3) - 1
                    continue
                self.left_through[x] = "M"
                return x
            x, hits = self.small.popitem(last=False)
            if hits >= self.threshold:
                self.main[x] = 0
                continue
            self.ghost[x] = None
            while len(self.ghost) > main_limit:
                self.ghost.popitem(last=False)
            self.left_through[x] = "S"
            return x


def drive(policy: object, ops: list[int], literal: LiteralSieve | LiteralS3Fifo) -> list[int]:
    """Play `ops` on the policy as a KV manager would (an access, then idle again; an eviction
    takes the smallest key of the idle entries through the candidate index) and on the literal
    algorithm; returns the victims, asserting they agree at every eviction."""
    index = CandidateIndex(policy)  # type: ignore[arg-type]
    entries: dict[int, CacheEntry] = {}
    cached: set[int] = set()
    victims = []
    for now, x in enumerate(ops, start=1):
        if x < 0:
            if not cached:
                continue
            if index.indexed:
                got = index.select(1, now, lambda e: e)
            else:
                got = policy.select_victims([entries[i] for i in sorted(cached)], 1, now)  # type: ignore[attr-defined]
            assert len(got) == 1
            policy.on_evict(got[0], now)  # type: ignore[attr-defined]
            index.discard(got[0].entry_id)
            cached.discard(got[0].entry_id)
            expected = literal.evict()
            assert got[0].entry_id == expected, (victims, expected)
            victims.append(expected)
            continue
        e = entries.get(x)
        if e is None:
            e = entries[x] = CacheEntry(x, x, 0, 0, 0, 16, 1, now, now)
        else:
            policy.on_access(e, now)  # type: ignore[attr-defined]
            index.discard(x)
        e.last_used_us = now
        policy.on_release(e, now)  # type: ignore[attr-defined]
        index.add(e, now)
        cached.add(x)
        literal.access(x)
    return victims


def make(name: str) -> object:
    return make_policy(policy_config(name), GapEstimator(0.3, 1e6, 1e6))


@settings(max_examples=200, deadline=None)
@given(ops_strategy)
def test_sieve_keys_evict_what_the_literal_sieve_evicts(ops: list[int]) -> None:
    drive(make("sieve"), ops, LiteralSieve())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), ops_strategy)
def test_s3fifo_order_evicts_what_the_literal_s3fifo_evicts(fill: int, ops: list[int]) -> None:
    """The literal cache's capacity is what the policy learns it to be: the most entries cached,
    reached by filling `fill` entries first."""
    warm = list(range(fill))
    ops = warm + [op for op in ops if op < 0 or op < fill]  # never more than `fill` cached
    policy = make("s3fifo")
    assert isinstance(policy, S3FifoPolicy)
    literal = LiteralS3Fifo(fill)
    drive(policy, ops, literal)
    assert policy.small.keys() == literal.small.keys()
    assert policy.main == literal.main


def test_a_visited_entry_survives_one_pass_of_the_hand() -> None:
    """Four entries, the second hit: the hand's first pass evicts the other three, clearing the
    bit of the visited one, which goes only on the next pass."""
    policy = make("sieve")
    assert isinstance(policy, SievePolicy)
    index = CandidateIndex(policy)
    entries = [CacheEntry(i, i, 0, 0, 0, 16, 1, i, i) for i in range(4)]
    for e in entries:
        policy.on_release(e, 10)
        index.add(e, 10)
    policy.on_access(entries[1], 11)
    policy.on_release(entries[1], 12)
    index.refresh(entries[1], 12)
    assert policy.visited(entries[1])
    order, bit = [], []
    for now in range(20, 24):
        (victim,) = index.select(1, now, lambda e: e)
        policy.on_evict(victim, now)
        order.append(victim.entry_id)
        bit.append(policy.visited(entries[1]))
    assert order == [0, 2, 3, 1]
    assert bit[:2] == [True, False]  # cleared when the hand passed it to evict entry 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=150), st.integers(4, 12))
def test_s3fifo_one_hit_entries_leave_through_the_small_queue(
    accesses: list[int], capacity: int
) -> None:
    """An entry that entered S and was not hit before its eviction leaves from S (to the ghost);
    only entries hit in S reach M."""
    policy = make("s3fifo")
    assert isinstance(policy, S3FifoPolicy)
    entries: dict[int, CacheEntry] = {}
    cached: set[int] = set()
    hit: dict[int, bool] = {}  # since it last entered the cache
    entered: dict[int, str] = {}  # the queue it last entered
    for now, x in enumerate(accesses, start=1):
        if x not in cached and len(cached) >= capacity:
            (victim,) = policy.select_victims([entries[i] for i in sorted(cached)], 1, now)
            v = victim.entry_id
            left_from = policy.queue_of(v)
            policy.on_evict(victim, now)
            cached.discard(v)
            if entered[v] == "S" and not hit[v]:
                assert left_from == "S", v
                assert v in policy.ghost
        e = entries.get(x)
        if e is None:
            e = entries[x] = CacheEntry(x, x, 0, 0, 0, 16, 1, now, now)
        else:
            policy.on_access(e, now)  # a hit, or a miss back after its eviction
        hit[x] = x in cached
        policy.on_release(e, now)
        if x not in cached:
            entered[x] = policy.queue_of(x)
            cached.add(x)
        for eid in policy.main:  # M holds only entries promoted after a hit, or back from G
            assert hit.get(eid) or entered[eid] == "M" or eid not in cached
