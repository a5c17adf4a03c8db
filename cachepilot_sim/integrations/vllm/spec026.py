"""PERC or reuse_forecast as vLLM 0.26's CPU-offload eviction policy (the 0.33 path: spec.py).

vLLM 0.26's `CPUOffloadingManager` knows only its own policies (`lru`, `arc`), but the spec is
pluggable. Select this one with

    kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "PercCPUOffloadingSpec026",
            "spec_module_path": "cachepilot_sim.integrations.vllm.spec026",
            "cpu_bytes_to_use": 8 << 30, "cachepilot_policy": "perc",   # or "reuse_forecast"
            "cachepilot_perc": {"delta_s": 30}}}

Its manager is vLLM's own with our policy in place of `_policy` (compat026.Policy026): every
store, load, ref count and event stays vLLM's. Imports vLLM 0.26 (its CUDA worker included), so
it runs on a CUDA host only; compat026.py, which holds the adaptation, is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from cachepilot_sim.integrations.vllm.compat026 import Policy026
from cachepilot_sim.integrations.vllm.forecast_chunks import ForecastChunkPolicy
from cachepilot_sim.integrations.vllm.params import EXTRA_CONFIG_KEY, params_from_mapping
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy

POLICY_KEY = "cachepilot_policy"
POLICIES = {"perc": PercChunkPolicy, "reuse_forecast": ForecastChunkPolicy}


class PercCPUOffloadingManager026(CPUOffloadingManager):  # type: ignore[misc]
    """vLLM 0.26's CPU offloading manager with a Policy026 as its cache policy."""

    def __init__(self, num_blocks: int, policy: Policy026, **kwargs: Any) -> None:
        super().__init__(num_blocks=num_blocks, cache_policy="lru", **kwargs)
        self._policy = policy

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        with self._policy.storing(req_context):
            return super().prepare_store(keys, req_context)

    def on_request_finished(self, req_context: Any) -> None:
        super().on_request_finished(req_context)
        self._policy.request_finished(req_context)


class PercCPUOffloadingSpec026(CPUOffloadingSpec):  # type: ignore[misc]
    """CPUOffloadingSpec whose manager ranks CPU chunks by PERC (or reuse_forecast)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        name = self.extra_config.get(POLICY_KEY, "perc")
        if name not in POLICIES:
            raise ValueError(
                f"kv_connector_extra_config.{POLICY_KEY}: {name!r} is not one of {sorted(POLICIES)}"
            )
        self.policy_cls = POLICIES[name]
        tokens_per_chunk = int(self.tokens_per_block[0]) * int(self.blocks_per_chunk)
        self.perc_params = params_from_mapping(
            self.extra_config.get(EXTRA_CONFIG_KEY, {}), tokens_per_chunk=tokens_per_chunk
        )

    def get_manager(self) -> Any:
        if not self._manager:  # type: ignore[has-type]  # set by CPUOffloadingSpec.__init__
            policy = Policy026(self.policy_cls(self.num_blocks, self.perc_params))
            self._manager = PercCPUOffloadingManager026(
                self.num_blocks,
                policy,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
            )
        return self._manager
