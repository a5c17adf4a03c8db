"""Classic cache baselines, written from their papers' rules for whole-session KV entries.

FIFO (order of entering the GPU cache), LFU (fewest uses, then LRU), SLRU (Karedla et al., IEEE
Computer 1994: a probationary and a protected segment), ARC (Megiddo & Modha, FAST'03: recency and
frequency lists with ghost lists steering the target; the target counts bytes because entries differ
in size) and GDSF (Cherkasova 1998: H = L + frequency x cost / size, L the H of the last victim).
A policy learns a hit or a miss from its own record of what it evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.lanes import Lane, LanedPolicy, Walk, in_lane
from cachepilot_sim.policies.reuse import GapEstimator
from cachepilot_sim.policies.set_indexes import ArcIndex, SlruIndex


class _TracksEvictions(RankingPolicy):
    """Remembers which entries it evicted, so that a returning session is a miss or a hit."""

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.evicted: set[int] = set()

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        """The KV manager evicted `entry`: its next access is a miss."""
        self.evicted.add(entry.entry_id)


@register("fifo")
class FifoPolicy(_TracksEvictions):
    """The entry that entered the GPU cache first is evicted first."""

    name = "fifo"
    key_scope = KeyScope.ENTRY  # a miss re-keys at on_access; the managers refresh then

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.inserted_us: dict[int, int] = {}

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        self.inserted_us.setdefault(entry.entry_id, entry.created_us)

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        super().on_evict(entry, now_us)
        self.inserted_us.pop(entry.entry_id, None)

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        if entry.entry_id in self.evicted:  # a miss: it re-enters the cache now
            self.evicted.discard(entry.entry_id)
            self.inserted_us[entry.entry_id] = now_us

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (self.inserted_us.get(entry.entry_id, entry.created_us), entry.entry_id)


@register("lfu")
class LfuPolicy(RankingPolicy):
    """Fewest uses first, least recently used among equals."""

    name = "lfu"
    key_scope = KeyScope.ENTRY

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (entry.num_uses, entry.last_used_us, entry.entry_id)


@dataclass
class SlruConfig(PolicyConfig):
    """SLRU's knob: the share of the idle KV bytes the protected (reused) segment may hold."""

    name: str = "slru"
    slru_protected_fraction: float = bounded(0.8, ge=0, le=1)


@register("slru", config=SlruConfig)
class SlruPolicy(_TracksEvictions):
    """A hit promotes to the protected segment (at most `slru_protected_fraction` of the idle bytes;
    its least recent overflow is demoted); probationary entries go first, each segment LRU."""

    name = "slru"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, SlruConfig), type(cfg)  # the registry pairs them
        self.protected_fraction = cfg.slru_protected_fraction
        self.protected: set[int] = set()
        self.kept: set[int] = set()  # protected entries within the segment's share (`prepare`)

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        if entry.entry_id in self.evicted:  # a miss re-enters probationary
            self.evicted.discard(entry.entry_id)
        else:
            self.protected.add(entry.entry_id)

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        super().on_evict(entry, now_us)
        self.protected.discard(entry.entry_id)

    def prepare(self, entries: Sequence[CacheEntry], now_us: int) -> None:
        """The protected segment holds at most its share of these idle bytes: its most recent
        entries that fit stay, the least recent overflow is demoted to probation."""
        room = self.protected_fraction * sum(e.num_bytes for e in entries)
        prot = sorted(
            (e for e in entries if e.entry_id in self.protected),
            key=lambda e: (-e.last_used_us, e.entry_id),
        )
        self.kept.clear()
        for e in prot:  # most recent first; the overflow is demoted
            if e.num_bytes > room:
                break
            self.kept.add(e.entry_id)
            room -= e.num_bytes

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        """Probation before the protected segment, each least recently used first."""
        return (int(entry.entry_id in self.kept), entry.last_used_us, entry.entry_id)

    def set_index(self) -> SlruIndex:
        """An exact index of `prepare` then greedy by key for whole entries: segment byte sums
        and orders (`policies/set_indexes.py`). After its decision `kept` holds only the victims
        taken from the protected segment: the keys read after a decision are the victims'."""
        return SlruIndex(self)


@register("arc")
class ArcPolicy(_TracksEvictions):
    """T1 (seen once) and T2 (reused) LRU lists; ghosts B1, B2 of recent victims move the target
    p (bytes of T1): a B1 hit raises it, a B2 hit lowers it. REPLACE takes T1's LRU while T1
    holds more than p, else T2's. As vLLM's CPU-offload ARC documents its rules (not its code):
    a hit in T1 promotes to T2, and a returning victim re-enters T1 after moving the target."""

    name = "arc"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.target_bytes = 0.0
        self.capacity_bytes = 0.0  # the most idle bytes seen at a decision: ARC's c
        self.frequent: set[int] = set()
        self.ghost1: OrderedDict[int, int] = OrderedDict()  # entry -> bytes, oldest first
        self.ghost2: OrderedDict[int, int] = OrderedDict()
        # Bytes held by ghost1 and ghost2, kept as running sums: prefix replay calls the hooks
        # once per block, and summing the lists each time would be quadratic.
        self.ghost_bytes = [0, 0]
        self.t1_excess: set[int] = set()  # T1 entries REPLACE takes before T2 (`prepare`)

    def _ghost_pop(self, which: int, eid: int) -> int:
        num_bytes = (self.ghost1, self.ghost2)[which].pop(eid)
        self.ghost_bytes[which] -= num_bytes
        return num_bytes

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        eid = entry.entry_id
        b1 = self.ghost_bytes[0] or 1
        b2 = self.ghost_bytes[1] or 1
        if eid in self.ghost1:
            self.target_bytes = min(
                self.target_bytes + max(b2 / b1, 1.0) * self._ghost_pop(0, eid), self.capacity_bytes
            )
        elif eid in self.ghost2:
            self.target_bytes = max(
                self.target_bytes - max(b1 / b2, 1.0) * self._ghost_pop(1, eid), 0.0
            )
        if eid in self.evicted:  # a miss: stored again, into T1
            self.evicted.discard(eid)
        else:  # a hit: T1 -> T2 (or MRU of T2)
            self.frequent.add(eid)

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        super().on_evict(entry, now_us)
        eid = entry.entry_id
        which = 1 if eid in self.frequent else 0
        self.frequent.discard(eid)
        ghost = (self.ghost1, self.ghost2)[which]
        self.ghost_bytes[which] += entry.num_bytes - ghost.get(eid, 0)
        ghost[eid] = entry.num_bytes
        for w, g in enumerate((self.ghost1, self.ghost2)):  # at most c bytes each
            while g and self.ghost_bytes[w] > self.capacity_bytes:
                self.ghost_bytes[w] -= g.popitem(last=False)[1]

    def prepare(self, entries: Sequence[CacheEntry], now_us: int) -> None:
        """REPLACE over these entries: T1's least recent entries go first while T1 holds more
        than the target, then T2, then the rest of T1 (each LRU); `t1_excess` is that first
        run."""
        self.capacity_bytes = max(self.capacity_bytes, float(sum(e.num_bytes for e in entries)))
        t1 = sorted(
            (e for e in entries if e.entry_id not in self.frequent),
            key=lambda e: (e.last_used_us, e.entry_id),
        )
        t1_bytes = float(sum(e.num_bytes for e in t1))
        self.t1_excess.clear()
        for e in t1:
            if t1_bytes <= self.target_bytes:
                break
            self.t1_excess.add(e.entry_id)
            t1_bytes -= e.num_bytes

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        """T1 beyond the target, then T2, then the rest of T1; least recently used first."""
        eid = entry.entry_id
        segment = 1 if eid in self.frequent else 0 if eid in self.t1_excess else 2
        return (segment, entry.last_used_us, eid)

    def set_index(self) -> ArcIndex:
        """An exact index of `prepare` then greedy by key for whole entries: T1 and T2 byte sums
        and orders (`policies/set_indexes.py`). After its decision `t1_excess` holds only the
        victims taken from T1's excess: the keys read after a decision are the victims'."""
        return ArcIndex(self)


@register("gdsf")
class GdsfPolicy(LanedPolicy, _TracksEvictions):
    """Greedy-Dual-Size-Frequency: H = L + uses x restore_us / bytes, L set at the last use; the
    inflation L rises to the H of each victim, so long-idle entries age out."""

    name = "gdsf"
    key_scope = KeyScope.DECISION  # reads the decision's restore estimate

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.inflation = 0.0
        self.base: dict[int, float] = {}

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        self.base[entry.entry_id] = self.inflation

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        super().on_evict(entry, now_us)
        self.inflation = max(self.inflation, self.h_value(entry))
        self.base.pop(entry.entry_id, None)

    def h_value(self, entry: CacheEntry, restore_us: float | None = None) -> float:
        """H with the entry's restore estimate (or `restore_us`)."""
        restore = entry.restore_us if restore_us is None else restore_us
        base = self.base.get(entry.entry_id, self.inflation)
        return base + entry.num_uses * restore / max(entry.num_bytes, 1)

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (self.h_value(entry), entry.entry_id)

    def key_at(self, entry: CacheEntry, restore_us: float, now_us: int) -> tuple[float | int, ...]:
        base = self.base.get(entry.entry_id, self.inflation)  # h_value's operations, inlined
        return (base + entry.num_uses * restore_us / max(entry.num_bytes, 1), entry.entry_id)

    def lane(self, entry: CacheEntry, restore_us: float, now_us: int) -> Lane:
        """H is fixed while idle for a given restore estimate (lane 0, by H); an entry idle
        without a base (KV reloaded, idle before its turn ends) reads the current inflation:
        lane 1 by v = uses x restore / bytes, where inflation + v is monotone in v."""
        v = entry.num_uses * restore_us / max(entry.num_bytes, 1)
        base = self.base.get(entry.entry_id)
        if base is None:
            return in_lane(1, (v, entry.entry_id), Walk.TIES)
        return in_lane(0, (base + v, entry.entry_id), Walk.STATIC)
