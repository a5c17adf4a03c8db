"""Pure cost functions of the serving model, parameters from a hardware config. No simpy here."""

from cachepilot_sim.cost.model import (
    ComputeFit,
    TransferFit,
    batch_iteration_us,
    compute_fit,
    decode_step_slope_us,
    iteration_us,
    prefill_us,
    quantize_us,
    recompute_us,
    transfer_fits,
    transfer_us,
)

__all__ = [
    "ComputeFit",
    "TransferFit",
    "batch_iteration_us",
    "compute_fit",
    "decode_step_slope_us",
    "iteration_us",
    "prefill_us",
    "quantize_us",
    "recompute_us",
    "transfer_us",
    "transfer_fits",
]
