"""An exact index for reuse_forecast's key: the smallest (P x restore / bytes, last use, id).

P = 1 - S_r(t + δ) / S_r(t), t an entry's idle time, S_r the survival curve of the row r it was
released into (fixed while it is idle), δ the policy's horizon (moved by every eviction with
`forecast_delta=eviction_age`, a query argument here). P is not monotone in t (a curve that drops
fast makes it rise), so no time-independent order exists; but every curve is non-increasing
(the shipped tables, and the online refit's product-limit curves), and that bounds P over a range
of idle times: for t in [a, b], P(t) >= 1 - S(a + δ) / S(b).

Each row keeps its entries in blocks of contiguous last-use times (L) of about sqrt(n) entries
(at least 64; `block_items` fixes the size), and every block's L range and smallest weight
w = restore / bytes sit in NumPy arrays shared by all rows. A query (1) bounds every block's keys
from below in one vectorised pass, (2) keys exactly the lightest and the oldest entry of the
block with the smallest bound (the oldest such block among equals), (3) gives an approximate key
(NumPy's log may differ from `math.log` by an ulp) to every entry of the blocks whose bound can
still beat that key, or tie it with an older last use, in one vectorised pass, and (4) computes
the exact key, with the policy's own scalar function (`score_at`), only of the entries whose
approximate key is within its error bound of the best: the result is exactly the full sort's
first entry. Keys that tie (a flat stretch of a curve gives P = 0 exactly,
`SurvivalTable.survival_at`) go to the oldest last use; a block newer than the best such entry
is not looked at.

Cost per query: O(n / block size) in NumPy for the bounds, plus the entries of the blocks whose
bound does not exclude them: a few blocks where blocks are narrow in idle time against δ and the
curves' slopes (a large or dense cache); every block where one spans more idle time than that (a
small cache, where the whole set is small). A table whose curves are not non-increasing is not
bounded: every block is scanned (exact, O(n) vectorised).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cachepilot_sim.policies.base import CacheEntry

if TYPE_CHECKING:
    from cachepilot_sim.policies.forecast_model import OnlineCurves, SurvivalTable


class ForecastKey(Protocol):
    """What the index reads of reuse_forecast (`ReuseForecastPolicy`; no import of it)."""

    rows: dict[int, int]  # entry id -> its curve, fixed at its last release
    priced: bool
    online: OnlineCurves | None
    table: SurvivalTable
    delta_us: float

    def score_at(self, row: int, idle_us: float, restore_us: float, num_bytes: int) -> float: ...


BLOCK_ITEMS = 64  # a block's least size target; sqrt(n) once larger
_S_ERR = 1e-12  # bound on |NumPy S - scalar S| (about 4e-14: an ulp of log t, times 40 / ln step)
_REL = 1e-12  # p * restore / bytes against p * (restore / bytes): a few ulps
_SURE = 1e-10  # below this S(t), P's exact value is not bounded from the approximation


def _survival(table: SurvivalTable, rows: np.ndarray, t_us: np.ndarray) -> np.ndarray:
    """`table.survival` with fewer NumPy calls (a flat gather): the same interpolation, so
    within an ulp of log t of `survival_at` (the index allows `_S_ERR`). The curves are read
    now (online refits rewrite them in place)."""
    curves = table.curves
    num = curves.shape[1]
    pos = np.log(np.maximum(t_us, 1.0))
    pos -= table.log_start
    pos /= table.log_step
    np.minimum(np.maximum(pos, 0.0, out=pos), num - 1.0, out=pos)
    i = np.minimum(pos.astype(np.int64), num - 2)
    f = pos - i
    k = rows * num + i
    flat = curves.reshape(-1)
    a, b = flat.take(k), flat.take(k + 1)
    s = a * (1.0 - f) + b * f
    same = a == b
    s[same] = a[same]
    s[t_us < table.grid[0] * 1e6] = 1.0
    return s


class _Block:
    """One row's items with last use in [start, next block's start), unordered."""

    __slots__ = ("slot", "row", "n", "last", "w", "ids")

    def __init__(self, slot: int, row: int, cap: int) -> None:
        self.slot, self.row, self.n = slot, row, 0
        self.last = np.empty(cap)
        self.w = np.empty(cap)
        self.ids = np.empty(cap, dtype=np.int64)


class ForecastIndex:
    """reuse_forecast's idle entries; `pop_min(now)` is the entry its sort would put first."""

    __slots__ = (
        "policy",
        "block_items",
        "num_keyed",
        "num_approx",
        "_items",
        "_starts",
        "_blocks",
        "_slot_block",
        "_free",
        "_row",
        "_lo",
        "_hi",
        "_wmin",
        "_bounds",
        "_bounds_at",
        "_monotone_at",
    )

    def __init__(self, policy: ForecastKey, block_items: int | None = None) -> None:
        if block_items is not None and block_items < 1:
            raise ValueError(f"ForecastIndex: block_items must be >= 1, got {block_items}")
        self.policy = policy
        self.block_items = block_items
        self.num_keyed = 0  # exact keys computed by queries (a complexity probe)
        self.num_approx = 0  # items given an approximate key by queries (another)
        # id -> [block, position, row, last use, restore, bytes]
        self._items: dict[int, list[Any]] = {}
        self._starts: dict[int, list[float]] = {}  # row -> its blocks' lower L bounds
        self._blocks: dict[int, list[_Block]] = {}  # row -> its blocks in L order
        self._slot_block: list[_Block | None] = []
        self._free: list[int] = []
        self._row = np.zeros(0, dtype=np.int64)  # per slot: the block's row
        self._lo = np.zeros(0)  # per slot: smallest L it holds
        self._hi = np.zeros(0)  # per slot: largest L it holds
        self._wmin = np.zeros(0)  # per slot: smallest weight now (inf: a free slot)
        self._bounds: np.ndarray | None = None  # lower bounds of the keys, per slot
        self._bounds_at: tuple[int, float, int] | None = None  # (now, delta, refits) of those
        self._monotone_at: tuple[int, bool] = (-1, False)  # (refits, every curve non-increasing)

    def __len__(self) -> int:
        return len(self._items)

    # -- updates ----------------------------------------------------------------------------
    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate stays `restore_us` while it is idle; its
        row is the policy's for it now (set at its release). The gap EMA is not read."""
        eid = entry.entry_id
        self.discard(eid)
        row = self.policy.rows.get(eid, 0)
        size = max(entry.num_bytes, 1)
        w = restore_us / size if self.policy.priced else 1.0
        if not 0.0 <= w < np.inf:
            raise ValueError(f"ForecastIndex.add: entry {eid} has weight {w}, need finite >= 0")
        self._insert(eid, row, entry.last_used_us, w, restore_us, size)

    def _insert(self, eid: int, row: int, last: int, w: float, restore: float, size: int) -> None:
        """Put an absent item in its row's block by last use (shared with `hazard_index.py`)."""
        blocks = self._blocks.get(row)
        if blocks is None:
            blocks = self._blocks[row] = [self._new_block(row)]
            self._starts[row] = [-np.inf]
        k = bisect_right(self._starts[row], last) - 1
        b = blocks[k]
        i = b.n
        if i == len(b.ids):
            for name in ("last", "w", "ids"):
                old = getattr(b, name)
                setattr(b, name, np.concatenate([old, np.empty_like(old)]))
        b.last[i], b.w[i], b.ids[i] = last, w, eid
        b.n = i + 1
        self._items[eid] = [b, i, row, last, restore, size]
        s = b.slot
        self._lo[s] = min(self._lo[s], last)
        self._hi[s] = max(self._hi[s], last)
        self._wmin[s] = min(self._wmin[s], w)
        if self._bounds is not None:
            self._bounds[s] = 0.0  # keys are >= 0: still a lower bound
        if b.n > 2 * self._target():
            self._split(row, k)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        item = self._items.pop(entry_id, None)
        if item is None:
            return
        b, i = item[0], item[1]
        j = b.n - 1
        w, last = b.w[i], b.last[i]
        if i != j:  # the last item takes the hole
            b.last[i], b.w[i], b.ids[i] = b.last[j], b.w[j], b.ids[j]
            self._items[int(b.ids[i])][1] = i
        b.n = j
        if j == 0:
            self._drop_block(item[2], b)
            return
        s = b.slot
        if w == self._wmin[s]:
            self._wmin[s] = b.w[:j].min()
        if last == self._lo[s] or last == self._hi[s]:  # keep the range tight: victims are old
            self._lo[s], self._hi[s] = b.last[:j].min(), b.last[:j].max()

    def _target(self) -> int:
        """Items per block: `block_items` when given, else sqrt(n) and at least BLOCK_ITEMS
        (a query's bounds cost n / size, its scans a few blocks' size)."""
        if self.block_items is not None:
            return self.block_items
        return max(BLOCK_ITEMS, math.isqrt(len(self._items)))

    def _new_block(self, row: int) -> _Block:
        if not self._free:
            old = len(self._slot_block)
            cap = max(2 * old, 8)
            self._slot_block.extend([None] * (cap - old))
            self._free.extend(range(cap - 1, old - 1, -1))
            self._row = np.concatenate([self._row, np.zeros(cap - old, dtype=np.int64)])
            self._lo = np.concatenate([self._lo, np.full(cap - old, np.inf)])
            self._hi = np.concatenate([self._hi, np.full(cap - old, -np.inf)])
            self._wmin = np.concatenate([self._wmin, np.full(cap - old, np.inf)])
            if self._bounds is not None:
                self._bounds = np.concatenate([self._bounds, np.full(cap - old, np.inf)])
        s = self._free.pop()
        b = _Block(s, row, 2 * self._target() + 1)
        self._slot_block[s] = b
        self._row[s] = row
        self._lo[s], self._hi[s], self._wmin[s] = np.inf, -np.inf, np.inf
        if self._bounds is not None:
            self._bounds[s] = 0.0
        return b

    def _drop_block(self, row: int, b: _Block) -> None:
        blocks, starts = self._blocks[row], self._starts[row]
        k = self._block_pos(row, b)
        del blocks[k], starts[k]
        if not blocks:
            del self._blocks[row], self._starts[row]
        elif k == 0:
            starts[0] = -np.inf  # the next block now covers everything older
        s = b.slot
        self._slot_block[s] = None
        self._free.append(s)
        self._lo[s], self._hi[s], self._wmin[s] = np.inf, -np.inf, np.inf
        if self._bounds is not None:
            self._bounds[s] = np.inf

    def _block_pos(self, row: int, b: _Block) -> int:
        """Position of block `b` among its row's blocks: its L range lies within its own span
        (starts are strictly increasing), so the bisection finds it."""
        k = bisect_right(self._starts[row], self._lo[b.slot]) - 1
        assert self._blocks[row][k] is b
        return k

    def _split(self, row: int, k: int) -> None:
        """Split the row's k-th block at a last-use time near its median."""
        b = self._blocks[row][k]
        n = b.n
        order = np.argsort(b.last[:n], kind="stable")
        last = b.last[:n][order]
        m = int(np.searchsorted(last, last[n // 2], side="left"))
        if m == 0:
            m = int(np.searchsorted(last, last[n // 2], side="right"))
        if m >= n:
            return  # one last-use time throughout: nothing to split at (bounds are exact)
        new = self._new_block(row)
        parts = [(b.last[part], b.w[part], b.ids[part]) for part in (order[:m], order[m:])]
        for dst, (dst_last, dst_w, dst_ids) in zip((b, new), parts, strict=True):
            size = len(dst_ids)
            dst.last[:size], dst.w[:size], dst.ids[:size] = dst_last, dst_w, dst_ids
            dst.n = size
            for pos, eid in enumerate(dst_ids.tolist()):
                item = self._items[eid]
                item[0], item[1] = dst, pos
            s = dst.slot
            self._lo[s], self._hi[s] = dst_last[0], dst_last[-1]
            self._wmin[s] = dst_w.min()
            if self._bounds is not None:
                self._bounds[s] = 0.0
        self._blocks[row].insert(k + 1, new)
        self._starts[row].insert(k + 1, float(last[m]))

    # -- queries ------------------------------------------------------------------------------
    def _block_bounds(self, now_us: int) -> np.ndarray:
        """Per slot, a lower bound of the keys of its items at `now_us` (inf: a free slot)."""
        policy = self.policy
        online = policy.online
        at = (now_us, policy.delta_us, online.num_refits if online is not None else 0)
        if self._bounds is not None and self._bounds_at == at:
            return self._bounds
        table, delta = policy.table, policy.delta_us
        used = self._wmin < np.inf
        if self._monotone_at[0] != at[2]:
            self._monotone_at = (at[2], bool((np.diff(table.curves, axis=1) <= 0.0).all()))
        if not self._monotone_at[1]:
            bounds = np.where(used, 0.0, np.inf)  # not monotone: nothing is bounded
        else:
            rows = self._row
            t_near = (
                np.maximum(now_us - np.where(used, self._hi, 0.0), 0.0) + delta
            )  # shortest idle + delta
            t_max = np.maximum(now_us - np.where(used, self._lo, 0.0), 0.0)
            both = _survival(table, np.concatenate([rows, rows]), np.concatenate([t_max, t_near]))
            num = len(rows)
            s_far = both[:num] - _S_ERR  # <= S(t) on the block
            s_near = both[num:] + _S_ERR  # >= S(t + delta)
            ratio = np.divide(s_near, s_far, out=np.ones_like(s_far), where=s_far > 1e-12)
            p_lo = np.maximum(1.0 - ratio, 0.0)
            bounds = np.where(used, p_lo * np.where(used, self._wmin, 0.0) * (1.0 - _REL), np.inf)
        self._bounds, self._bounds_at = bounds, at
        return bounds

    def _exact(self, eid: int, now_us: int) -> tuple[float, int, int]:
        """The policy's key of an indexed entry, from the policy's own scalar function."""
        _, _, row, last, restore, size = self._items[eid]
        self.num_keyed += 1
        idle = float(max(now_us - last, 0))
        return (self.policy.score_at(row, idle, restore, size), last, eid)

    def _scan(
        self, slots: np.ndarray, now_us: int, best: tuple[float, int, int] | None
    ) -> tuple[float, int, int] | None:
        """The smallest key among `best` and the items of the blocks in `slots`."""
        live = [b for b in map(self._slot_block.__getitem__, slots.tolist()) if b is not None]
        if len(live) == 1:
            b = live[0]
            last, w, ids = b.last[: b.n], b.w[: b.n], b.ids[: b.n]
            rows = np.full(2 * b.n, b.row, dtype=np.int64)
        else:
            last = np.concatenate([b.last[: b.n] for b in live])
            w = np.concatenate([b.w[: b.n] for b in live])
            ids = np.concatenate([b.ids[: b.n] for b in live])
            counts = [b.n for b in live] * 2
            rows = np.repeat(np.array([b.row for b in live] * 2, dtype=np.int64), counts)
        num = len(ids)
        self.num_approx += num
        table, delta = self.policy.table, self.policy.delta_us
        idle = np.maximum(now_us - last, 0.0)
        both = _survival(table, rows, np.concatenate([idle, idle + delta]))
        s_now, s_later = both[:num], both[num:]
        sure = s_now > _SURE
        safe = np.where(sure, s_now, 1.0)
        p = np.where(sure, np.maximum(1.0 - s_later / safe, 0.0), 0.0)
        key = p * w
        tol = np.where(sure, w * (3.0 * _S_ERR / (safe - _S_ERR) + 1e-15) + _REL * key, np.inf)
        lower = np.maximum(key - tol, 0.0)
        upper = float((key + tol).min())
        cap = upper if best is None else min(upper, best[0])
        pick = np.flatnonzero(lower <= cap)
        order = np.lexsort((ids[pick], last[pick], lower[pick]))
        pick = pick[order]
        lo, la, ii = lower[pick], last[pick], ids[pick]
        while len(pick):
            if best is None:
                j = 0
            else:
                k, bl, bi = best
                ok = (lo < k) | ((lo <= k) & ((la < bl) | ((la == bl) & (ii < bi))))
                j = int(ok.argmax())
                if not ok[j]:
                    break
            cand = self._exact(int(ii[j]), now_us)
            if best is None or cand < best:
                best = cand
            lo[j] = np.inf  # keyed
        return best

    def peek_min(self, now_us: int) -> int | None:
        """The id of the entry with the smallest (key, last use, id) at `now_us`, or None."""
        if not self._items:
            return None
        bounds = self._block_bounds(now_us)
        m = float(bounds.min())
        first = np.flatnonzero(bounds == m)
        b = self._slot_block[int(first[np.argmin(self._lo[first])])]
        assert b is not None
        # A first best from the most promising block, without scanning it: its lightest and
        # its oldest entry (the oldest decides among keys that tie at 0).
        picks = {int(b.ids[int(np.argmin(b.w[: b.n]))]), int(b.ids[int(np.argmin(b.last[: b.n]))])}
        best = min(self._exact(eid, now_us) for eid in picks)
        key, last, _ = best
        more = (bounds < key) | ((bounds <= key) & (self._lo <= last))
        found = self._scan(np.flatnonzero(more), now_us, best)
        assert found is not None
        return found[2]

    def pop_min(self, now_us: int) -> int | None:
        """`peek_min`, and the entry leaves the index."""
        eid = self.peek_min(now_us)
        if eid is not None:
            self.discard(eid)
        return eid

    def num_blocks(self) -> int:
        """Blocks in use (a probe for tests)."""
        return sum(len(b) for b in self._blocks.values())
