"""`cachepilot-sim profile-gpu --out DIR`: the GPU micro-profile (kernels/profile_gpu.py).

The profile itself imports only torch and the standard library, so it also runs as
`python3 cachepilot_sim/kernels/profile_gpu.py` on a bare GPU host; this is its console name.
"""

from __future__ import annotations

from cachepilot_sim.kernels.profile_gpu import main

__all__ = ["main"]
