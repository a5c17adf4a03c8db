"""model.max_context_tokens holds for synthetic sessions: no turn's context (earlier turns, prompt
and output) runs past the window, whatever the window and the length means (issue 15)."""

from __future__ import annotations

import numpy as np
import pytest

from cachepilot_sim.config import ModelConfig
from cachepilot_sim.rng import make_streams
from cachepilot_sim.workloads.synthetic import SessionFactory
from tests.conftest import make_sim_config


@pytest.mark.parametrize("window", [2, 3, 16, 100, 257, 1000, 4096])
def test_every_session_fits_the_context_window(window: int) -> None:
    cfg = make_sim_config(model=ModelConfig(max_context_tokens=window))
    factory = SessionFactory(cfg, make_streams(0))
    for _ in range(300):
        spec = factory.make()
        total = np.cumsum(spec.prompt_tokens + spec.output_tokens)
        assert total[-1] <= window, (window, spec)
        assert (spec.prompt_tokens >= 1).all() and (spec.output_tokens >= 1).all()
