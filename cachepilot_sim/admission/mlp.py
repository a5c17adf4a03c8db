"""A one-hidden-layer tanh MLP in NumPy: features -> logits of {admit, defer, reject}.

Weights are a plain `.npz` (loaded with `allow_pickle=False`) plus a `.json` beside it naming the
features in input order, so a file trained on another feature set fails loudly instead of silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cachepilot_sim.inputs import InputError, refuse_special_file

NUM_ACTIONS = 3  # admit, defer, reject (Decision order)
ARRAYS = ("w1", "b1", "w2", "b2")


class WeightsError(InputError):
    """A weights file that is missing or does not fit; the message names the file."""


@dataclass
class Mlp:
    w1: np.ndarray  # (num_features, hidden)
    b1: np.ndarray  # (hidden,)
    w2: np.ndarray  # (hidden, NUM_ACTIONS)
    b2: np.ndarray  # (NUM_ACTIONS,)
    feature_names: list[str]

    @classmethod
    def init(cls, feature_names: list[str], hidden: int, rng: np.random.Generator) -> Mlp:
        n = len(feature_names)
        return cls(
            rng.normal(0.0, 1.0 / np.sqrt(n), (n, hidden)),
            np.zeros(hidden),
            rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, NUM_ACTIONS)),
            np.zeros(NUM_ACTIONS),
            list(feature_names),
        )

    def params(self) -> list[np.ndarray]:
        return [self.w1, self.b1, self.w2, self.b2]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """x: (batch, num_features) -> (batch, NUM_ACTIONS)."""
        return np.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2

    def loss_and_grads(
        self, x: np.ndarray, actions: np.ndarray, weights: np.ndarray, mask: np.ndarray
    ) -> tuple[float, list[np.ndarray]]:
        """Loss -sum_i weights[i] * log pi(actions[i] | x[i]) over allowed actions (mask True)
        and its gradient per parameter. Cross-entropy imitation: weights = 1/batch; REINFORCE:
        weights = advantage / batch."""
        h = np.tanh(x @ self.w1 + self.b1)
        z = np.where(mask, h @ self.w2 + self.b2, -1e9)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(x.shape[0])
        loss = -float(np.sum(weights * np.log(p[rows, actions] + 1e-300)))
        dz = p * weights[:, None]
        dz[rows, actions] -= weights
        dh = (dz @ self.w2.T) * (1.0 - h * h)
        return loss, [x.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2)
        spec = {
            "features": self.feature_names,
            "actions": ["admit", "defer", "reject"],
            "hidden": int(self.b1.size),
        }
        path.with_suffix(".json").write_text(json.dumps(spec, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path, feature_names: list[str]) -> Mlp:
        """Load `path` (.npz) and its `.json` feature spec; WeightsError naming the file when
        either is missing, malformed, or trained on other features."""
        spec_path = path.with_suffix(".json")
        refuse_special_file(path, "admission weights", WeightsError)
        refuse_special_file(spec_path, "admission weights' spec", WeightsError)
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = [np.asarray(f[k], dtype=np.float64) for k in ARRAYS]
            spec = json.loads(spec_path.read_text())
            names = list(spec["features"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WeightsError(
                f"admission weights {path} (spec {spec_path}) unreadable: {e}"
            ) from e
        if names != list(feature_names):
            raise WeightsError(
                f"admission weights {path}: trained on features {names}, this "
                f"simulation has {list(feature_names)}"
            )
        w1, b1, w2, b2 = arrays
        n, hidden = len(names), b1.size
        shapes = [(n, hidden), (hidden,), (hidden, NUM_ACTIONS), (NUM_ACTIONS,)]
        if [a.shape for a in arrays] != shapes or not all(np.isfinite(a).all() for a in arrays):
            raise WeightsError(
                f"admission weights {path}: array shapes {[a.shape for a in arrays]}"
                f" (expected {shapes}) or non-finite values"
            )
        return cls(w1, b1, w2, b2, names)
