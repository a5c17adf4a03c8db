"""The classes vLLM loads: PERC and reuse_forecast as KV-offload CPU cache policies for vLLM 0.33.

Select one with `kv_connector_extra_config={"eviction_policy": "PercCachePolicy"` (or
`"ReuseForecastCachePolicy"`), `"cache_policy_module_path":
"cachepilot_sim.integrations.vllm.policy", ...}`; vLLM's CachePolicyFactory imports this module
and builds the class with `cache_capacity`. All behaviour lives in `perc_chunks` and
`forecast_chunks`; this module only adds vLLM's base class.
"""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from cachepilot_sim.integrations.vllm.chunks import Clock
from cachepilot_sim.integrations.vllm.forecast_chunks import ForecastChunkPolicy
from cachepilot_sim.integrations.vllm.params import (
    FORECAST_POLICY_NAME,
    POLICY_MODULE,
    POLICY_NAME,
    PercParams,
)
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy

MODULE_PATH = POLICY_MODULE
assert MODULE_PATH == __name__, "params.POLICY_MODULE must name this module"


class PercCachePolicy(PercChunkPolicy, CachePolicy):  # type: ignore[misc]
    """vLLM CachePolicy whose methods come from PercChunkPolicy (listed first in the MRO)."""

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        PercChunkPolicy.__init__(self, cache_capacity, params, clock)


class ReuseForecastCachePolicy(ForecastChunkPolicy, CachePolicy):  # type: ignore[misc]
    """vLLM CachePolicy whose methods come from ForecastChunkPolicy (listed first in the MRO)."""

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        ForecastChunkPolicy.__init__(self, cache_capacity, params, clock)


assert PercCachePolicy.__name__ == POLICY_NAME, "params.POLICY_NAME must name this class"
assert ReuseForecastCachePolicy.__name__ == FORECAST_POLICY_NAME, "params.FORECAST_POLICY_NAME"
