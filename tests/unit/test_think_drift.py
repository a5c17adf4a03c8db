"""Think-time drift: gaps that start once the drift has begun are scaled, the others unchanged,
and the default leaves every gap as drawn."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cachepilot_sim.config import ConfigError
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config


def _gaps(drift: float, at: int) -> dict[int, int]:
    base = make_sim_config()
    wl = replace(
        base.workload, num_requests=120, think_drift_multiplier=drift, think_drift_at_request=at
    )
    sim = build(replace(base, workload=wl))
    gaps: dict[int, int] = {}
    sim.clients.on_end.append(
        lambda r: gaps.__setitem__(r.req_id, r.next_gap_us) if r.next_gap_us >= 0 else None
    )
    sim.run()
    return gaps


def test_gaps_after_the_drift_are_scaled_and_earlier_ones_are_not() -> None:
    plain, drifted = _gaps(1.0, 0), _gaps(3.0, 60)
    early = [i for i in plain if i < 60 and i in drifted]
    assert early and all(drifted[i] == plain[i] for i in early)
    # Later requests differ in timing (longer gaps shift the arrivals), so compare the draws:
    # each drifted gap after request 60 is three times some drawn gap, none before it is.
    late = [g for i, g in drifted.items() if i >= 60]
    assert late and sum(late) / len(late) > 2.0 * sum(plain.values()) / len(plain)


def test_default_multiplier_changes_nothing() -> None:
    assert _gaps(1.0, 0) == _gaps(1.0, 50)


def test_bad_multiplier_is_refused() -> None:
    base = make_sim_config()
    with pytest.raises(ConfigError, match="think_drift_multiplier"):
        replace(base.workload, think_drift_multiplier=0.0).validate("workload")
