"""PERC-hazard's Kaplan-Meier curve equals scipy's (`scipy.stats.ecdf` on censored data)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from cachepilot_sim.policies.perc_variants import SurvivalEstimate


def test_survival_curve_matches_scipy_ecdf_with_censoring() -> None:
    rng = np.random.default_rng(0)
    est = SurvivalEstimate(512)
    for i in range(300):
        est.release(i, int(rng.integers(0, 10**6)))
    for i in range(0, 300, 3):  # a third come back; the others are censored at their idle time
        est.returned(i, 2 * 10**6 + int(rng.integers(0, 10**6)))
    now = 4 * 10**6
    curve = est.curve(now)
    assert curve is not None
    times, surv = curve
    recs = np.array(list(est.released.values()), dtype=np.int64)
    event = recs[:, 1] >= 0
    dur = np.where(event, recs[:, 1], now - recs[:, 0]).astype(np.float64)
    ref = stats.ecdf(stats.CensoredData(uncensored=dur[event], right=dur[~event]))
    np.testing.assert_allclose(surv, ref.sf.evaluate(times), rtol=1e-12, atol=1e-15)
