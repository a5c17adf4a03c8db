"""Pure cost functions of the serving model; parameters come from a hardware config. No simpy here."""

from cachepilot_sim.cost.model import (
    ComputeFit,
    TransferFit,
    compute_fit,
    decode_step_slope_us,
    iteration_us,
    prefill_us,
    recompute_us,
    transfer_us,
    transfer_fits,
)

__all__ = [
    "ComputeFit",
    "TransferFit",
    "compute_fit",
    "decode_step_slope_us",
    "iteration_us",
    "prefill_us",
    "recompute_us",
    "transfer_us",
    "transfer_fits",
]
