"""Synthetic returning sessions: a class mix, log-normal lengths and think times, geometric turn
counts.

Every random quantity of session i is drawn when session i is created, and sessions are created in
arrival order, so two policies run on one seed face identical sessions (common random numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cachepilot_sim.clock import s_to_us
from cachepilot_sim.config import SimConfig, WorkloadClass
from cachepilot_sim.rng import RngStreams


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """All turns of one session, drawn up front; turn k's prompt extends the earlier context."""

    session_id: int
    class_index: int
    model_index: int
    prompt_tokens: np.ndarray  # new tokens the user adds per turn
    output_tokens: np.ndarray  # tokens generated per turn
    think_us: np.ndarray  # idle time after turn k's answer, before turn k+1 is sent

    @property
    def num_turns(self) -> int:
        return int(self.prompt_tokens.shape[0])


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Log-normal samples with the given arithmetic mean (sigma is the log-space spread)."""
    mu = math.log(mean) - sigma * sigma / 2.0
    return rng.lognormal(mu, sigma, size) if sigma > 0 else np.full(size, mean)


class SessionFactory:
    """Draws session i's class, turns, lengths and think times from dedicated streams."""

    def __init__(self, cfg: SimConfig, streams: RngStreams) -> None:
        wl = cfg.workload
        self.class_names = list(wl.classes)
        self.classes: list[WorkloadClass] = [wl.classes[n] for n in self.class_names]
        shares = np.array([c.share for c in self.classes], dtype=np.float64)
        self._cum_share = np.cumsum(shares / shares.sum())
        model_names = [m.name for m in cfg.models]
        self.model_of_class = [model_names.index(c.model) if c.model else 0 for c in self.classes]
        self.max_context = [cfg.models[i].max_context_tokens for i in self.model_of_class]
        self._streams = streams
        self._next_id = 0

    def make(self) -> SessionSpec:
        s = self._streams
        sid = self._next_id
        self._next_id += 1
        ci = int(np.searchsorted(self._cum_share, s.sessions.random(), side="right"))
        ci = min(ci, len(self.classes) - 1)
        cls = self.classes[ci]
        turns = int(s.sessions.geometric(1.0 / cls.turns_mean))
        prompt = np.maximum(
            1,
            np.rint(_lognormal(s.lengths, cls.prompt_tokens_mean, cls.prompt_tokens_sigma, turns)),
        )
        output = np.maximum(
            1,
            np.rint(_lognormal(s.lengths, cls.output_tokens_mean, cls.output_tokens_sigma, turns)),
        )
        think = _lognormal(s.think_times, cls.think_time_mean_s, cls.think_time_sigma, turns)
        prompt_i = prompt.astype(np.int64)
        output_i = output.astype(np.int64)
        # A client stops the conversation before a turn would exceed the model's context window
        # (model.max_context_tokens). A first turn longer than the window is cut to fit, output
        # included: the server caps max_tokens at what the window has left, as engines do.
        window = self.max_context[ci]
        total = np.cumsum(prompt_i + output_i)
        keep = max(1, int(np.searchsorted(total, window, side="right")))
        if total[0] > window:
            output_i[0] = max(1, min(int(output_i[0]), window // 2))
            prompt_i[0] = max(1, window - int(output_i[0]))
        think_us = np.fromiter((s_to_us(t) for t in think[:keep]), dtype=np.int64, count=keep)
        return SessionSpec(
            sid, ci, self.model_of_class[ci], prompt_i[:keep], output_i[:keep], think_us
        )
