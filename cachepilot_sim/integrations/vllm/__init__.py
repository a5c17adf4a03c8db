"""PERC and reuse_forecast as vLLM 0.33 KV-offload CPU cache policies.

`policy.PercCachePolicy` and `policy.ReuseForecastCachePolicy` are the classes vLLM loads (that
module imports vLLM); `chunks.SessionChunkPolicy` holds the chunk and session bookkeeping,
`perc_chunks.PercChunkPolicy` and `forecast_chunks.ForecastChunkPolicy` the two rankings, none of
them importing vLLM, so they are tested without the wheel; `params` reads the parameters (env var
or the connector's extra config); `replay` drives any CachePolicy with a session workload for the
evictor benchmark. See docs/vllm.md.
"""

from cachepilot_sim.integrations.vllm.params import ENV_VAR, PercParams, params_from_env

__all__ = ["ENV_VAR", "PercParams", "params_from_env"]
