"""CachePilot-Sim: a discrete-event simulator of KV-cache management in LLM serving.

Importing the package imports nothing else: the GPU kernels (`cachepilot_sim.kernels`) run on a
host with only NumPy, CuPy, Triton and torch. The named choices (eviction policies, admission
controllers, routers) register when their registry is first read (config/registry.py).
"""
