"""Admission control: the default changes nothing, the threshold rule does what it says, and every
request still ends completed or rejected with a reason."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from cachepilot_sim.admission import AdmissionView, Decision
from cachepilot_sim.admission.controllers import Threshold
from cachepilot_sim.config import AdmissionConfig, ConfigError, admission_config
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload


def make_view(**overrides: Any) -> AdmissionView:
    values: dict[str, Any] = dict(
        queue_depth=20,
        pool_bytes=1000,
        free_bytes=50,
        evictable_bytes=0,
        held_bytes=950,
        need_bytes=100,
        tokens=500,
        class_index=0,
        num_classes=2,
        eviction_rate_per_s=0.0,
        running_fraction=0.5,
        num_defers=0,
        max_defers=2,
    )
    values.update(overrides)
    return AdmissionView(**values)


def overloaded(admission: AdmissionConfig) -> Any:
    wl = make_workload(num_requests=80, max_active_sessions=64, spike_multiplier=16.0)
    return make_sim_config(workload=wl, vram_gb=9.5, admission=admission)


def test_threshold_defers_then_rejects_when_loaded_and_queue_deep() -> None:
    rule = Threshold(load_fraction=0.9, queue_depth=16)
    assert rule.decide(make_view()) == Decision.DEFER
    assert rule.decide(make_view(num_defers=2)) == Decision.REJECT


def test_threshold_admits_when_load_or_queue_is_below_its_limit() -> None:
    rule = Threshold(load_fraction=0.9, queue_depth=16)
    assert rule.decide(make_view(held_bytes=900)) == Decision.ADMIT
    assert rule.decide(make_view(queue_depth=16)) == Decision.ADMIT


def test_default_admission_is_off_and_an_always_admitting_gate_changes_nothing() -> None:
    base = build(overloaded(AdmissionConfig()))
    assert base.batcher.gate is None
    never = admission_config("threshold", threshold_load_fraction=1.0)
    gated = build(overloaded(never))
    assert gated.batcher.gate is not None
    assert_frame_equal(base.run().requests, gated.run().requests)


def test_aggressive_threshold_rejects_only_first_turns_and_every_request_ends() -> None:
    cfg = admission_config(
        "threshold",
        threshold_load_fraction=0.0,
        threshold_queue_depth=0,
        pressure_queue_depth=1,
        max_defers=1,
        defer_ms=50.0,
    )
    result = build(overloaded(cfg)).run()
    req = result.requests
    assert set(req["outcome"].unique()) <= {"completed", "rejected"}
    rejected = req.filter(pl.col("outcome") == "rejected")
    assert rejected.height > 0 and (rejected["reject_reason"] != "").all()
    by_gate = rejected.filter(pl.col("reject_reason") == "admission")
    assert by_gate.height == result.metrics["admission_rejected"] > 0
    assert (by_gate["turn"] == 0).all()


def test_learned_admission_without_weights_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="admission.weights"):
        admission_config("learned")
    with pytest.raises(ConfigError, match="unknown admission controller"):
        AdmissionConfig(name="oracle")


def test_a_controller_with_knobs_needs_its_own_config_class() -> None:
    with pytest.raises(ConfigError, match=r"admission\.name.*reads ThresholdAdmissionConfig"):
        AdmissionConfig(name="threshold")
