"""PERC as a vLLM 0.33 KV-offload CPU cache policy.

`policy.PercCachePolicy` is the class vLLM loads (it imports vLLM); `chunks.PercChunkPolicy` holds
all the logic and imports nothing from vLLM, so it is tested without the wheel; `params` reads the
parameters (env var or the connector's extra config); `replay` drives any CachePolicy with a
session workload for the evictor benchmark. See docs/vllm.md.
"""

from cachepilot_sim.integrations.vllm.params import ENV_VAR, PercParams, params_from_env

__all__ = ["ENV_VAR", "PercParams", "params_from_env"]
