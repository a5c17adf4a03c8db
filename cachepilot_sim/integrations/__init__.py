"""Adapters that run the simulator's policies inside real serving engines (vLLM first)."""
