"""reuse_forecast: PERC's rule with a learned forecast of when an idle entry is used next.

At each release the entry's features (forecast_features.py: class, context size, turns, earlier
gaps, recent release rate) pick a survival curve of its next gap from a table trained offline on
simulator traces (forecast_model.py; sessions that never return are part of the curve). At a
decision, P(next use within delta | idle t) = 1 - S(t + delta) / S(t), and the key is P x
restore_us / bytes (PERC's expected restore cost per byte), LRU among equals. delta is either the
configured horizon or learned online as the cache's characteristic time: the EMA of the idle age
at which entries are evicted. The score is a pure function of (bucket curve, idle time, delta,
restore estimate, bytes): a vLLM policy can compute it from the same fields.

With `policy.forecast_online=true` the table is a prior that adapts while the run goes
(forecast_model.OnlineCurves): each bucket's curve is refit, every `forecast_online_every` of its
observations, by the product-limit rule from the gaps the hooks observed (a release followed by
an access) and the entries still idle (censored at their age now), with the shipped curve as
`forecast_online_prior` pseudo-releases and only the bucket's last `forecast_online_window`
releases counted. Off by default: the offline table alone, exactly as before.

Decisions pop from an exact index of the key (`policies/forecast_index.py`, `time_index`), in
every mode: δ and refit curves are read at each query, so a learned δ and online refits keep it
exact; the managers fall back to keying every candidate only where the restore estimate moves
with idle time (`policies/candidates.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.config.base import require
from cachepilot_sim.config.workload import ReplayConfig, TraceFormat
from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.forecast_features import (
    ReleaseState,
    ReleaseTracker,
    bucket_values,
)
from cachepilot_sim.policies.forecast_index import ForecastIndex
from cachepilot_sim.policies.forecast_model import (
    OnlineCurves,
    SurvivalTable,
    model_path,
    shipped_tables,
)
from cachepilot_sim.policies.reuse import GapEstimator

AUTO_TABLE = "auto"  # forecast_model: the table trained on the run's workload
DEFAULT_TABLE = "mixed_spike"  # the table of a workload no table was trained on
TABLE_FOR_REPLAY = {TraceFormat.MOONCAKE: "mooncake_synthetic"}  # shipped tables, by trace


class ForecastDelta(StrEnum):
    """The horizon of P(next use within delta): the configured delta_s, or learned online."""

    FIXED = "fixed"
    EVICTION_AGE = "eviction_age"


class ForecastPricing(StrEnum):
    """What a forecast is weighed by: restore cost per byte (PERC), or nothing (forecast only)."""

    RESTORE = "restore"
    NONE = "none"


@dataclass
class ReuseForecastConfig(PolicyConfig):
    """reuse_forecast's knobs: the model table (a shipped table's name, or a path to a .json),
    how delta is chosen and whether restore cost prices the forecast."""

    name: str = "reuse_forecast"
    # `auto`: the shipped table trained on the run's workload (for_workload), mixed_spike's for
    # a workload no table was trained on; a name picks a shipped table, a path any table.
    forecast_model: str = field(default=AUTO_TABLE, metadata={"nonempty": True})
    forecast_delta: ForecastDelta = ForecastDelta.EVICTION_AGE
    # EMA weight of one eviction's idle age, for forecast_delta=eviction_age (delta_s seeds it).
    forecast_age_weight: float = bounded(0.05, gt=0, le=1)
    forecast_pricing: ForecastPricing = ForecastPricing.RESTORE
    # Keep every release's state, access and eviction (training rows for prefix-block replays,
    # calibration of the forecast at eviction time).
    forecast_record: bool = False
    # Refit each bucket's curve online from the gaps observed in this run (the table is the prior).
    forecast_online: bool = False
    # The shipped curve's weight in the online refit, in releases (pseudo-counts).
    forecast_online_prior: float = bounded(100.0, gt=0)
    # Releases per bucket the online refit remembers (bounds the data's weight against the prior).
    forecast_online_window: int = bounded(1000, ge=1, integer=True)
    # A bucket is refit after this many of its observations (releases and observed gaps).
    forecast_online_every: int = bounded(5, ge=1, integer=True)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        if self.forecast_model == AUTO_TABLE:
            return
        path = model_path(self.forecast_model)
        require(
            path.is_file(),
            f"{prefix}.forecast_model",
            self.forecast_model,
            f"no such table ({path}); shipped: " + ", ".join(p.stem for p in shipped_tables()),
        )

    def for_workload(self, replay: ReplayConfig) -> PolicyConfig:
        """`auto` becomes the table trained on this workload: the Mooncake trace's for a Mooncake
        replay, mixed_spike's otherwise (the synthetic sessions it was trained on, and the
        fallback for the Azure and ShareGPT traces, which no table was trained on)."""
        if self.forecast_model != AUTO_TABLE:
            return self
        return replace(self, forecast_model=TABLE_FOR_REPLAY.get(replay.format, DEFAULT_TABLE))


@register("reuse_forecast", config=ReuseForecastConfig)
class ReuseForecastPolicy(RankingPolicy):
    """Evicts the lowest forecast P(next use within delta) x restore_us / bytes first."""

    name = "reuse_forecast"
    key_scope = KeyScope.DECISION  # P decays (or grows) with idle time: keyed per decision

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, ReuseForecastConfig), type(cfg)  # the registry pairs them
        table = DEFAULT_TABLE if cfg.forecast_model == AUTO_TABLE else cfg.forecast_model
        self.table = SurvivalTable.load(model_path(table))
        self.delta_mode = cfg.forecast_delta
        self.age_weight = cfg.forecast_age_weight
        self.priced = cfg.forecast_pricing == ForecastPricing.RESTORE
        # Unpriced, the key reads no restore estimate: its index serves every decision.
        self.time_index_reads_restore = self.priced
        self.delta_us = float(estimator.delta_us)
        self.tracker = ReleaseTracker()
        self.rows: dict[int, int] = {}  # entry id -> its curve, fixed at its last release
        self.record = cfg.forecast_record
        self.release_log: list[tuple[int, int, ReleaseState]] = []
        self.access_log: list[tuple[int, int]] = []
        self.evict_log: list[tuple[int, int, float, float]] = []  # entry id, time, P, delta us
        self.num_evictions = 0
        self.p_evicted_sum = 0.0
        self.online = (
            OnlineCurves(
                self.table,
                cfg.forecast_online_prior,
                cfg.forecast_online_window,
                cfg.forecast_online_every,
            )
            if cfg.forecast_online
            else None
        )

    # -- hooks: the features are read once per release ------------------------------------
    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        state = self.tracker.release(entry.entry_id, entry.class_index, entry.num_tokens, now_us)
        row = self.table.row(bucket_values(self.table.features, state))
        self.rows[entry.entry_id] = row
        if self.online is not None:
            self.online.release(entry.entry_id, row, now_us)
        if self.record:
            self.release_log.append((entry.entry_id, now_us, state))

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        self.tracker.access(entry.entry_id, now_us - entry.last_used_us)
        if self.online is not None:
            self.online.access(entry.entry_id, now_us)
        if self.record:
            self.access_log.append((entry.entry_id, now_us))

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        p = self.probability(entry, now_us)
        self.num_evictions += 1
        self.p_evicted_sum += p
        if self.record:
            self.evict_log.append((entry.entry_id, now_us, p, self.delta_us))
        if self.delta_mode == ForecastDelta.EVICTION_AGE:
            age = float(max(now_us - entry.last_used_us, 0))
            self.delta_us += self.age_weight * (age - self.delta_us)

    # -- ranking ----------------------------------------------------------------------------
    def probability(self, entry: CacheEntry, now_us: int) -> float:
        """Forecast P(next use within delta | idle so far)."""
        idle = float(max(now_us - entry.last_used_us, 0))
        return self.table.resume_within_at(self.rows.get(entry.entry_id, 0), idle, self.delta_us)

    def score(self, entry: CacheEntry, now_us: int) -> float:
        """P x restore_us / bytes (or P alone with forecast_pricing=none)."""
        idle = float(max(now_us - entry.last_used_us, 0))
        row = self.rows.get(entry.entry_id, 0)
        return self.score_at(row, idle, entry.restore_us, entry.num_bytes)

    def score_at(self, row: int, idle_us: float, restore_us: float, num_bytes: int) -> float:
        """The score of an entry of curve `row` idle `idle_us` (the one function the sort and
        the index both key with, so their floats cannot differ)."""
        p = self.table.resume_within_at(row, idle_us, self.delta_us)
        return p * restore_us / max(num_bytes, 1) if self.priced else p

    def time_index(self) -> ForecastIndex:
        """An exact index of this key (`policies/forecast_index.py`): a decision keys the
        entries of the blocks of idle time whose bound can beat the best, not every entry."""
        return ForecastIndex(self)

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        # Plain floats, one entry at a time: the prefix manager keys every chain tail alone.
        return (self.score(entry, now_us), entry.last_used_us, entry.entry_id)

    def metrics(self) -> dict[str, float]:
        """The learned delta and the mean forecast P of the evicted entries."""
        mean_p = self.p_evicted_sum / self.num_evictions if self.num_evictions else 0.0
        out = {"forecast_delta_s": self.delta_us / 1e6, "forecast_evicted_p_mean": mean_p}
        if self.online is not None:
            out["forecast_online_refits"] = float(self.online.num_refits)
            out["forecast_online_gaps"] = float(self.online.num_gaps)
        return out
