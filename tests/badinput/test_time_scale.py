"""replay.time_scale does what it says for every format (ShareGPT's Poisson arrivals included),
and a scale that would overflow int64 microseconds is refused naming file, line and key (issue 15).
"""

from __future__ import annotations

import numpy as np
import pytest

from cachepilot_sim.config import ModelConfig, ReplayConfig, TraceConfig, TraceFormat
from cachepilot_sim.rng import make_streams
from cachepilot_sim.workloads.replay import load_replay
from cachepilot_sim.workloads.traces import TraceError
from tests.conftest import make_sim_config

SHAREGPT = "samples:sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MOONCAKE = "samples:mooncake_synthetic/synthetic_trace.jsonl"
AZURE = "samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def _arrivals(fmt: TraceFormat, path: str, scale: float) -> np.ndarray:
    cfg = make_sim_config(
        model=ModelConfig(max_context_tokens=131_072),
        trace=TraceConfig(enabled=False),
        replay=ReplayConfig(format=fmt, path=path, limit=40, time_scale=scale),
    )
    return load_replay(cfg, make_streams(0).arrivals).arrival_us


@pytest.mark.parametrize(
    ("fmt", "path"),
    [
        (TraceFormat.SHAREGPT, SHAREGPT),
        (TraceFormat.MOONCAKE, MOONCAKE),
        (TraceFormat.AZURE, AZURE),
    ],
)
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_time_scale_multiplies_every_arrival(fmt: TraceFormat, path: str, scale: float) -> None:
    base = _arrivals(fmt, path, 1.0)
    assert _arrivals(fmt, path, scale).tolist() == np.rint(base * scale).astype(np.int64).tolist()


@pytest.mark.parametrize("scale", [1e300, 1e30, 1e16])
@pytest.mark.parametrize(
    ("fmt", "path"), [(TraceFormat.MOONCAKE, MOONCAKE), (TraceFormat.AZURE, AZURE)]
)
def test_an_overflowing_time_scale_is_refused_naming_the_key(
    fmt: TraceFormat, path: str, scale: float
) -> None:
    with pytest.raises(TraceError, match=r":\d+: arrival .* replay\.time_scale=.* over the limit"):
        _arrivals(fmt, path, scale)
