"""reuse_forecast: the features mean the same offline and online, the table is read as trained,
training is deterministic and refuses evaluation data, a run is deterministic."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cachepilot_sim.config import policy_config, to_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.forecast_features import FEATURES, ReleaseState, bucket_values
from cachepilot_sim.policies.forecast_model import (
    ForecastModelError,
    SurvivalTable,
    model_path,
)
from cachepilot_sim.sim import build
from cachepilot_sim.tools import train_forecast
from cachepilot_sim.tools.forecast_data import (
    NEVER,
    censored,
    fit_table,
    release_rows_from_log,
    release_rows_from_trace,
)
from cachepilot_sim.trace.derive import load_trace
from tests.unit.test_hydra_configs import compose_run

SMALL = ["+experiment=mixed_spike", "workload.num_requests=160", "vram_gb=10"]


def recorded_run(tmp_path: Path) -> tuple[list, list]:
    """A small run of reuse_forecast with its own log and the event trace; both row lists."""
    run = to_config(
        compose_run(
            [
                *SMALL,
                "policy=reuse_forecast",
                "policy.forecast_record=true",
                "trace.iteration_every=99",
            ]
        )
    )
    sim = build(run.sim_for("reuse_forecast", 3), tmp_path / "trace")
    sim.run()
    policy = sim.policy
    live = release_rows_from_log(policy.release_log, policy.access_log)  # type: ignore[attr-defined]
    lf, _ = load_trace(tmp_path / "trace")
    return live, release_rows_from_trace(lf.collect())


def test_features_from_the_trace_equal_those_the_policy_computed_live(tmp_path: Path) -> None:
    live, offline = recorded_run(tmp_path)
    assert len(live) > 100
    key = lambda r: (r[1], r[0].recent_releases, r[0].num_tokens)  # noqa: E731
    live, offline = sorted(live, key=key), sorted(offline, key=key)
    assert [r[0] for r in live] == [r[0] for r in offline]  # every raw state, field by field
    assert [r[2] for r in live] == [r[2] for r in offline]  # and every label
    assert any(r[0].num_gaps > 0 for r in live) and any(r[2] == NEVER for r in live)
    for s, _, _ in live:
        assert bucket_values(FEATURES, s) == bucket_values(FEATURES, s)


def exp_table(mean_gaps_s: list[float], never: list[float]) -> SurvivalTable:
    """One bucket per class: S(t) = never + (1 - never) exp(-t / mean)."""
    grid = (0.1, 100_000.0, 81)
    t = np.geomspace(grid[0], grid[1], grid[2])
    curves = [np.ones(grid[2])]
    for m, q in zip(mean_gaps_s, never, strict=True):
        curves.append(q + (1 - q) * np.exp(-t / m))
    keys = [(), *[(c,) for c in range(len(mean_gaps_s))]]
    return SurvivalTable(("class",), grid, keys, np.array(curves))


def entry(i: int, class_index: int, last_used_us: int, restore_us: float = 1e4) -> CacheEntry:
    return CacheEntry(
        entry_id=i,
        session_id=i,
        model_index=0,
        class_index=class_index,
        priority=0,
        num_tokens=1000,
        num_bytes=1 << 20,
        created_us=0,
        last_used_us=last_used_us,
        restore_us=restore_us,
    )


def policy_with(table: SurvivalTable, tmp_path: Path, **cfg: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "table.json"
    table.save(path)
    pc = policy_config("reuse_forecast", forecast_model=str(path), **cfg)
    return make_policy(pc, GapEstimator(pc.ema_weight, pc.prior_gap_s * 1e6, pc.delta_s * 1e6))


def test_an_entry_forecast_to_return_sooner_is_evicted_after_a_later_one(tmp_path: Path) -> None:
    policy = policy_with(exp_table([10.0, 300.0, 10.0], [0.0, 0.0, 0.9]), tmp_path)
    sooner, later, likely_never = entry(1, 0, 0), entry(2, 1, 0), entry(3, 2, 0)
    for e in (sooner, later, likely_never):
        policy.on_release(e, 0)
    now = 5_000_000
    assert policy.key(later, now) < policy.key(sooner, now)
    assert policy.key(likely_never, now) < policy.key(sooner, now)
    assert policy.order([sooner, later, likely_never], now)[-1] is sooner


def test_the_table_backs_off_to_the_longest_stored_prefix(tmp_path: Path) -> None:
    table = exp_table([10.0], [0.2])
    assert table.row((0,)) == 1 and table.row((5,)) == 0 and table.row(()) == 0
    table.save(tmp_path / "t.json")
    again = SurvivalTable.load(tmp_path / "t.json")
    assert again.keys == table.keys
    np.testing.assert_allclose(again.curves, table.curves, atol=1e-5)
    p = again.resume_within(np.array([0, 1, 1]), np.array([0.0, 1e6, 1e9]), 30e6)
    assert np.all((p >= 0) & (p <= 1)) and p[0] == 0.0 and 0.7 < p[1] < 0.8 and p[2] < 1e-6
    scalar = [again.resume_within_at(r, t, 30e6) for r, t in ((0, 0.0), (1, 1e6), (1, 1e9))]
    np.testing.assert_allclose(scalar, p, rtol=1e-12, atol=1e-15)


def test_a_bad_model_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ForecastModelError, match="bad.json: key 'format'"):
        SurvivalTable.load(bad)
    with pytest.raises(ForecastModelError, match="missing.json"):
        SurvivalTable.load(tmp_path / "missing.json")


def test_the_shipped_table_was_trained_on_training_seeds_only() -> None:
    table = SurvivalTable.load(model_path("mixed_spike"))
    lo, hi = table.meta["seeds"]
    assert lo >= 100 and not set(range(lo, hi + 1)) & set(train_forecast.EVAL_SEEDS)
    assert len(table.keys) > 20 and set(table.features) <= set(FEATURES)


@pytest.mark.parametrize(
    "argv",
    [["--seeds", "5-20"], ["--seeds", "0"], ["--first-fraction", "0.7"], ["--features", "x"]],
)
def test_training_refuses_evaluation_data_and_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        train_forecast.parse(argv)
    assert exc.value.code == 2


def test_training_is_deterministic(tmp_path: Path) -> None:
    argv = ["--seeds", "100-101", "--min-count", "5", "--override", "workload.num_requests=120"]
    for name in ("a.json", "b.json"):
        assert train_forecast.main([*argv, "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    table = SurvivalTable.load(tmp_path / "a.json")
    assert table.meta["seeds"] == [100, 101] and table.meta["num_rows"] > 100


def test_fit_keeps_sessions_that_never_return_in_the_curve() -> None:
    s = ReleaseState(0, 1, 500, -1, 0, 0, 1)
    rows = [(s, 0, 10_000_000)] * 30 + [(s, 0, NEVER)] * 10
    table = fit_table(rows, ("class",), (0.1, 1000.0, 41), 5, 1.0, {})
    assert table.curves[0, -1] == pytest.approx(0.25)  # a quarter never came back
    assert table.curves[0, 0] == pytest.approx(1.0)


def test_a_run_is_deterministic_and_reports_its_learned_delta() -> None:
    run = to_config(compose_run([*SMALL, "policy=reuse_forecast", "trace.enabled=false"]))
    cfg = run.sim_for("reuse_forecast", 1)
    a, b = build(cfg).run().metrics, build(replace(cfg)).run().metrics
    assert a == b
    assert a["forecast_delta_s"] > 0 and 0 <= a["forecast_evicted_p_mean"] <= 1


def test_fit_drops_a_censored_release_from_risk_instead_of_counting_it_as_never() -> None:
    s = ReleaseState(0, 1, 500, -1, 0, 0, 1)
    # Half were watched for only 1 s (the training part of a trace ended), half came back at 10 s.
    rows = [(s, 0, 10_000_000)] * 20 + [(s, 0, censored(1_000_000))] * 20
    table = fit_table(rows, ("class",), (0.1, 1000.0, 41), 5, 1.0, {})
    assert table.curves[0, -1] == pytest.approx(0.0)  # every one at risk at 10 s came back
    naive = [(s, 0, 10_000_000)] * 20 + [(s, 0, NEVER)] * 20
    naive_table = fit_table(naive, ("class",), (0.1, 1000.0, 41), 5, 1.0, {})
    assert naive_table.curves[0, -1] == pytest.approx(0.5)


def test_survival_table_curve_is_scipys_kaplan_meier() -> None:
    """The training's product-limit curve equals scipy.stats.ecdf on censored data (returned
    gaps are events; censored rows at their last watch and NEVER rows at infinity are not)."""
    from scipy import stats

    from cachepilot_sim.tools.forecast_data import CENSORED, NEVER, _survival

    rng = np.random.default_rng(5)
    events = rng.integers(1, 10_000, 300)
    censored_at = rng.integers(1, 10_000, 80)
    gaps = np.concatenate([events, CENSORED - censored_at, np.full(20, NEVER)]).astype(np.int64)
    grid = np.linspace(0, 12_000, 41)
    ours = _survival(gaps, grid)
    big = float(np.iinfo(np.int64).max)
    data = stats.CensoredData(
        uncensored=events.astype(float),
        right=np.concatenate([censored_at.astype(float), np.full(20, big)]),
    )
    theirs = stats.ecdf(data).sf.evaluate(grid)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
