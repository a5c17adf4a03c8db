"""The class vLLM loads: PERC as a KV-offload CPU cache policy for vLLM 0.33.

Select it with
`kv_connector_extra_config={"eviction_policy": "PercCachePolicy",
"cache_policy_module_path": "cachepilot_sim.integrations.vllm.policy", ...}`;
vLLM's CachePolicyFactory imports this module and builds `PercCachePolicy(cache_capacity=...)`.
All behaviour lives in `chunks.PercChunkPolicy`; this module only adds vLLM's base class.
"""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from cachepilot_sim.integrations.vllm.chunks import Clock, PercChunkPolicy
from cachepilot_sim.integrations.vllm.params import POLICY_MODULE, POLICY_NAME, PercParams

MODULE_PATH = POLICY_MODULE
assert MODULE_PATH == __name__, "params.POLICY_MODULE must name this module"


class PercCachePolicy(PercChunkPolicy, CachePolicy):  # type: ignore[misc]
    """vLLM CachePolicy whose methods come from PercChunkPolicy (listed first in the MRO)."""

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        PercChunkPolicy.__init__(self, cache_capacity, params, clock)


assert PercCachePolicy.__name__ == POLICY_NAME, "params.POLICY_NAME must name this class"
