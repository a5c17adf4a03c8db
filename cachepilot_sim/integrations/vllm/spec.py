"""vLLM's CPU offloading spec with our policy, configured from `kv_connector_extra_config`.

Select it with `"spec_name": "PercCPUOffloadingSpec", "spec_module_path":
"cachepilot_sim.integrations.vllm.spec"` and put PERC's parameters under `"cachepilot_perc"`; the
chunk size (tokens per block x blocks per chunk) is taken from the spec. Importing vLLM's
CPUOffloadingSpec pulls in its CUDA worker, so this module is exercised only on a CUDA host; the
hand-over it relies on (`params.pending_params`) is tested on CPU.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from cachepilot_sim.integrations.vllm.params import (
    EXTRA_CONFIG_KEY,
    POLICY_MODULE,
    POLICY_NAME,
    params_from_mapping,
    pending_params,
)


class PercCPUOffloadingSpec(CPUOffloadingSpec):  # type: ignore[misc]
    """CPUOffloadingSpec whose manager builds PercCachePolicy with the extra config's parameters."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.eviction_policy = POLICY_NAME
        self.cache_policy_module_path = POLICY_MODULE
        tokens_per_chunk = int(self.tokens_per_block[0]) * int(self.blocks_per_chunk)
        self.perc_params = params_from_mapping(
            self.extra_config.get(EXTRA_CONFIG_KEY, {}), tokens_per_chunk=tokens_per_chunk
        )

    def get_manager(self) -> Any:
        with pending_params(self.perc_params):
            return super().get_manager()
