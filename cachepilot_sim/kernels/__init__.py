"""GPU kernels that move and quantize paged KV blocks between HBM and pinned host memory.

The timings of these kernels, measured on the H200, calibrate the simulator's PCIe and quantize cost
parameters. Three implementations of every operation: CUDA (`kernels_cuda/*.cu` through CuPy
`RawModule`, `cuda.py`), Triton (`triton_kernels.py`) and NumPy (`reference.py`, the definition).
Only `layout`, `formats` and `reference` are imported here: CuPy, torch and Triton stay optional.
"""

from cachepilot_sim.kernels.layout import KvGeometry, QuantFormat

__all__ = ["KvGeometry", "QuantFormat"]
