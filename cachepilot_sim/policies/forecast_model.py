"""The reuse forecast's model: per feature bucket, the survival curve of an entry's next idle gap.

S_b(t) = P(the gap after a release in bucket b exceeds t), sessions that never come back included
(S tends to their share, not to 0). Curves sit on one log-spaced grid of gap times; a bucket with
few training releases was shrunk towards its parent (the key without its last feature) when the
table was trained, and a key missing from the table backs off to its longest stored prefix (the
empty key, the whole population, is always stored). The table is plain JSON written by
`cachepilot-sim train-forecast`; reading it needs only NumPy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from cachepilot_sim.inputs import InputError
from cachepilot_sim.policies.forecast_features import FEATURES

FORMAT = "cachepilot-reuse-forecast/1"
# Tables shipped in the package, by name (`policy.forecast_model=<name>`): one per training source.
SHIPPED_DIR = Path(__file__).with_name("forecast_tables")


def model_path(name: str) -> Path:
    """A shipped table's path for a bare name (no '/', no '.json'), else `name` as a path."""
    if "/" not in name and not name.endswith(".json"):
        return SHIPPED_DIR / f"{name}.json"
    return Path(name)


def shipped_tables() -> list[Path]:
    return sorted(SHIPPED_DIR.glob("*.json"))


class ForecastModelError(InputError):
    """A model file that is missing or malformed; the message names the file and the key."""


class SurvivalTable:
    """Survival curves per bucket key: `row` once per release, `survival` vectorised per
    decision."""

    def __init__(
        self,
        features: tuple[str, ...],
        grid: tuple[float, float, int],
        keys: list[tuple[int, ...]],
        curves: np.ndarray,
        meta: dict[str, Any] | None = None,
    ) -> None:
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise ForecastModelError(f"unknown features {unknown}; known: {', '.join(FEATURES)}")
        if () not in keys:
            raise ForecastModelError("the table has no population row (the empty key)")
        self.features = features
        start_s, stop_s, num = grid
        self.grid = (float(start_s), float(stop_s), int(num))
        self.log_start = math.log(start_s * 1e6)
        self.log_step = (math.log(stop_s * 1e6) - self.log_start) / (num - 1)
        self.keys = keys
        self.index = {k: i for i, k in enumerate(keys)}
        self.curves = np.asarray(curves, dtype=np.float64)
        if self.curves.shape != (len(keys), num):
            raise ForecastModelError(
                f"curves have shape {self.curves.shape}, not ({len(keys)}, {num})"
            )
        self.meta = meta or {}
        self._rows = [list(map(float, c)) for c in self.curves]  # for the scalar path

    def survival_at(self, row: int, t_us: float) -> float:
        """S_row(t) for one item, in plain floats (a decision keys each candidate alone): the
        same interpolation as `survival`."""
        start_us = self.grid[0] * 1e6
        if t_us < start_us:
            return 1.0
        curve = self._rows[row]
        last = len(curve) - 1
        pos = min(max((math.log(max(t_us, 1.0)) - self.log_start) / self.log_step, 0.0), last)
        i = min(int(pos), last - 1)
        f = pos - i
        a, b = curve[i], curve[i + 1]
        # A flat segment is its value exactly: a * (1 - f) + a * f can be off by an ulp either
        # way, and P would then order entries of a flat stretch by that noise, not LRU.
        return a if a == b else a * (1.0 - f) + b * f

    def resume_within_at(self, row: int, idle_us: float, delta_us: float) -> float:
        """`resume_within` for one item; never negative (S is non-increasing; rounding could
        make S(t + delta) exceed S(t) by an ulp)."""
        s_now = self.survival_at(row, idle_us)
        if s_now <= 1e-12:
            return 0.0
        return max(1.0 - self.survival_at(row, idle_us + delta_us) / s_now, 0.0)

    def grid_us(self) -> np.ndarray:
        """The gap times (µs) the curves are given at."""
        start, stop, num = self.grid
        return np.geomspace(start * 1e6, stop * 1e6, num)

    def row(self, key: tuple[int, ...]) -> int:
        """The curve of `key`: its own, or that of its longest stored prefix."""
        for n in range(len(key), -1, -1):
            i = self.index.get(key[:n])
            if i is not None:
                return i
        raise AssertionError("unreachable: the empty key is always stored")

    def survival(self, rows: np.ndarray, t_us: np.ndarray) -> np.ndarray:
        """S_row(t) per item, linear in log t between grid points; 1 before the grid's start,
        the last point's value after its end."""
        curves = self.curves
        pos = (np.log(np.maximum(t_us, 1.0)) - self.log_start) / self.log_step
        pos = np.clip(pos, 0.0, curves.shape[1] - 1.0)
        i = np.minimum(pos.astype(np.int64), curves.shape[1] - 2)
        f = pos - i
        a, b = curves[rows, i], curves[rows, i + 1]
        s = np.where(a == b, a, a * (1.0 - f) + b * f)  # flat: exactly its value (survival_at)
        return np.where(t_us < self.grid[0] * 1e6, 1.0, s)

    def resume_within(self, rows: np.ndarray, idle_us: np.ndarray, delta_us: float) -> np.ndarray:
        """P(next use within delta | idle so far) = 1 - S(idle + delta) / S(idle)."""
        s_now = self.survival(rows, idle_us)
        s_later = self.survival(rows, idle_us + delta_us)
        p = np.where(s_now > 1e-12, 1.0 - s_later / np.maximum(s_now, 1e-12), 0.0)
        return np.maximum(p, 0.0)

    def to_json(self) -> dict[str, Any]:
        start, stop, num = self.grid
        return {
            "format": FORMAT,
            "features": list(self.features),
            "grid_s": {"start": start, "stop": stop, "num": num},
            "meta": self.meta,
            "buckets": [
                {"key": list(k), "survival": [round(float(v), 5) for v in c]}
                for k, c in zip(self.keys, self.curves, strict=True)
            ],
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=None, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> SurvivalTable:
        """Read a table written by `save`; a bad file is a ForecastModelError naming it."""
        try:
            data = json.loads(Path(path).read_text())
            if data.get("format") != FORMAT:
                raise ForecastModelError(f"key 'format' is not {FORMAT!r}")
            g = data["grid_s"]
            keys = [tuple(int(v) for v in b["key"]) for b in data["buckets"]]
            curves = np.array([b["survival"] for b in data["buckets"]], dtype=np.float64)
            return cls(
                tuple(data["features"]),
                (g["start"], g["stop"], g["num"]),
                keys,
                curves,
                data.get("meta", {}),
            )
        except ForecastModelError as err:
            raise ForecastModelError(f"{path}: {err}") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ForecastModelError(f"{path}: not a reuse-forecast table ({err!r})") from err


class _Window:
    """A bucket's last `size` observations, a ring: release time and gap (-1 open, -2 none)."""

    __slots__ = ("release_us", "gap_us", "count")

    def __init__(self, size: int) -> None:
        self.release_us = np.zeros(size, dtype=np.int64)
        self.gap_us = np.full(size, -2, dtype=np.int64)
        self.count = 0  # observations ever opened; the next goes to slot count % size


class OnlineCurves:
    """A table's curves refit while the simulation runs: the product-limit (Kaplan-Meier) form
    with the shipped curve as `prior_weight` pseudo-releases.

    Each release opens an observation in the bucket (table row) it was keyed into; the entry's
    next access closes it with the observed gap; an observation still open (idle, or evicted
    and not back yet: the policy sees a return after eviction too) is right-censored at its age
    now. Per grid interval j = (g_{j-1}, g_j]: hazard_j = (n0 dS_j + d_j) / (n0 S_{j-1} + r_j),
    d_j the observed gaps in it, r_j the observations at risk at its start (a censored one counts
    half in the interval it leaves, the actuarial rule); S = prod (1 - hazard). Without data the
    prior is returned exactly. Only the last `window` releases of a bucket count, so the data's
    weight is bounded: an all-censored stream shrinks each hazard at most by n0 S / (n0 S +
    window), never to 0 (the floor). A bucket is refit after every `every` of its observations
    (opened or closed), in place in the table, so a decision reads the curve as cheaply as before.
    Reads only what the hooks gave up to now.
    """

    def __init__(self, table: SurvivalTable, prior_weight: float, window: int, every: int) -> None:
        self.table = table
        self.window = window
        self.every = every
        self.grid_us = table.grid_us()
        prior = table.curves.copy()
        s_prev = np.concatenate([np.ones((len(prior), 1)), prior[:, :-1]], axis=1)
        self.prior_risk = prior_weight * s_prev
        self.prior_events = prior_weight * np.maximum(s_prev - prior, 0.0)
        self.windows: dict[int, _Window] = {}
        self.open: dict[int, tuple[int, int]] = {}  # entry id -> (row, number of its observation)
        self.since_refit: dict[int, int] = {}
        self.num_refits = 0
        self.num_gaps = 0

    def _slot(self, entry_id: int) -> tuple[int, _Window, int] | None:
        """The entry's open observation (row, window, slot), unless it left the window."""
        row_seq = self.open.pop(entry_id, None)
        if row_seq is None:
            return None
        row, seq = row_seq
        win = self.windows[row]
        if win.count - seq > self.window:  # overwritten by a later release
            return None
        return row, win, seq % self.window

    def release(self, entry_id: int, row: int, now_us: int) -> None:
        """The entry became idle now, its next gap forecast by `row`: open an observation."""
        old = self._slot(entry_id)
        if old is not None:  # released again without an access seen: its end is unknown
            old[1].gap_us[old[2]] = -2
        win = self.windows.get(row)
        if win is None:
            win = self.windows[row] = _Window(self.window)
        slot = win.count % self.window
        win.release_us[slot] = now_us
        win.gap_us[slot] = -1
        self.open[entry_id] = (row, win.count)
        win.count += 1
        self._count(row, now_us)

    def access(self, entry_id: int, now_us: int) -> None:
        """The entry is used again now: its open observation (if any) is a gap."""
        found = self._slot(entry_id)
        if found is None:
            return
        row, win, slot = found
        win.gap_us[slot] = now_us - win.release_us[slot]
        self.num_gaps += 1
        self._count(row, now_us)

    def _count(self, row: int, now_us: int) -> None:
        n = self.since_refit.get(row, 0) + 1
        if n >= self.every:
            self.refit(row, now_us)
            n = 0
        self.since_refit[row] = n

    def refit(self, row: int, now_us: int) -> None:
        """Row's curve from its prior and its window's observations as of now."""
        num = len(self.grid_us)
        d = np.zeros(num + 1)
        c = np.zeros(num + 1)
        win = self.windows.get(row)
        if win is not None:
            g = win.gap_us
            gaps = g[g >= 0]
            ages = now_us - win.release_us[g == -1]
            # Bin k: the first grid time >= x (num: past the grid's end, at risk throughout).
            d = np.bincount(np.searchsorted(self.grid_us, gaps), minlength=num + 1).astype(float)
            c = np.bincount(np.searchsorted(self.grid_us, ages), minlength=num + 1).astype(float)
        at_risk = np.cumsum((d + c)[::-1])[::-1][:num] - 0.5 * c[:num]
        den = self.prior_risk[row] + at_risk
        hazard = np.divide(self.prior_events[row] + d[:num], den, out=np.zeros(num), where=den > 0)
        curve = np.cumprod(1.0 - np.minimum(hazard, 1.0))
        self.table.curves[row] = curve
        self.table._rows[row] = curve.tolist()
        self.num_refits += 1
