"""The admission MLP: gradients against finite differences, .npz round trip, clear load errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cachepilot_sim.admission import Decision
from cachepilot_sim.admission.controllers import Learned
from cachepilot_sim.admission.mlp import Mlp, WeightsError
from cachepilot_sim.config import admission_config
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config
from tests.unit.test_admission import make_view, overloaded

NAMES = ["a", "b", "c", "d"]


def make_mlp(seed: int = 0) -> Mlp:
    return Mlp.init(NAMES, hidden=5, rng=np.random.default_rng(seed))


def test_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(1)
    mlp = make_mlp()
    x = rng.normal(size=(7, len(NAMES)))
    actions = np.array([0, 1, 2, 0, 2, 0, 1])
    weights = rng.normal(size=7)  # signed, as REINFORCE advantages are
    mask = np.ones((7, 3), dtype=bool)
    mask[3, 1] = False  # a request out of defers
    _, grads = mlp.loss_and_grads(x, actions, weights, mask)
    eps = 1e-6
    for p, g in zip(mlp.params(), grads, strict=True):
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            up, _ = mlp.loss_and_grads(x, actions, weights, mask)
            p[idx] = old - eps
            down, _ = mlp.loss_and_grads(x, actions, weights, mask)
            p[idx] = old
            assert g[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-7)


def test_npz_round_trip_keeps_every_array_and_the_feature_spec(tmp_path: Path) -> None:
    mlp = make_mlp()
    path = tmp_path / "w.npz"
    mlp.save(path)
    back = Mlp.load(path, NAMES)
    for a, b in zip(mlp.params(), back.params(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert back.feature_names == NAMES


def test_missing_weights_file_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="nowhere.npz"):
        Mlp.load(tmp_path / "nowhere.npz", NAMES)


def test_malformed_weights_file_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    make_mlp().save(path)
    np.savez(path, w1=np.zeros((2, 2)), b1=np.zeros(2), w2=np.zeros((2, 3)), b2=np.zeros(3))
    with pytest.raises(WeightsError, match="bad.npz.*shapes"):
        Mlp.load(path, NAMES)
    path.write_bytes(b"not a zip")
    with pytest.raises(WeightsError, match="bad.npz"):
        Mlp.load(path, NAMES)


def test_weights_for_other_features_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    make_mlp().save(path)
    with pytest.raises(WeightsError, match="trained on features"):
        Mlp.load(path, ["x", "y", "z", "w"])


def test_learned_controller_never_defers_once_defers_are_spent() -> None:
    names = [f"f{i}" for i in range(10)]  # 9 base features + one class
    mlp = Mlp.init(names, 3, np.random.default_rng(0))
    mlp.b2[:] = (0.0, 100.0, -100.0)  # loves to defer, never rejects
    fresh = make_view(num_defers=0, num_classes=1)
    spent = make_view(num_defers=2, max_defers=2, num_classes=1)
    assert Learned(mlp).decide(fresh) == Decision.DEFER
    assert Learned(mlp).decide(spent) == Decision.ADMIT


def test_learned_admission_runs_from_a_weights_file(tmp_path: Path) -> None:
    sim0 = build(overloaded(admission_config("threshold")))
    assert sim0.batcher.gate is not None
    path = tmp_path / "w.npz"
    Mlp.init(sim0.batcher.gate.feature_names, 4, np.random.default_rng(0)).save(path)
    result = build(overloaded(admission_config("learned", weights=str(path)))).run()
    assert set(result.requests["outcome"].unique()) <= {"completed", "rejected"}
    with pytest.raises(WeightsError, match="missing.npz"):
        build(make_sim_config(admission=admission_config("learned", weights="missing.npz")))


def test_training_is_deterministic_given_the_seed(tmp_path: Path) -> None:
    from cachepilot_sim.config import register_configs
    from cachepilot_sim.tools.train_admission import main

    register_configs()
    tiny = [
        "--train-seeds",
        "1",
        "--episode-requests",
        "150",
        "--imitation-epochs",
        "2",
        "--iterations",
        "1",
        "--episodes",
        "2",
        "--eval-every",
        "1",
        "--hidden",
        "4",
    ]
    arrays = []
    for run in ("a", "b"):
        out = tmp_path / run / "w.npz"
        main(["--out", str(out), "--seed", "3", *tiny])
        names = json.loads(out.with_suffix(".json").read_text())["features"]
        arrays.append(Mlp.load(out, names).params())
    for a, b in zip(*arrays, strict=True):
        np.testing.assert_array_equal(a, b)
