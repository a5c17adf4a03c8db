"""What a captured engine's profile (a fitted or physical step cost) allows a run to change: its
batching rule is its own, and a fitted step cost runs only on the GPUs its errors were measured
on. The idealised roofline engine (engine=default) allows everything and is labelled unvalidated."""

from __future__ import annotations

from cachepilot_sim.config import trust_registry
from cachepilot_sim.config.base import require
from cachepilot_sim.config.engine import BatcherConfig, BatchMode
from cachepilot_sim.config.engine_profile import EngineConfig, StepCost
from cachepilot_sim.config.hardware import GpuSpecConfig


def check_captured_engine(
    engine: EngineConfig, batcher: BatcherConfig, gpu: GpuSpecConfig, tp: int, measuring: bool
) -> None:
    """Refuse, naming the key, a run that takes a captured engine off the rules or GPUs its
    step cost and errors were measured with (`measuring`: validate's replay of a capture)."""
    if engine.step_cost == StepCost.ROOFLINE:
        return
    # A captured engine batches by one token budget (docs/validation.md, "Engine rules"):
    # another batching mode is a rule its step cost and errors never saw.
    require(
        batcher.mode == BatchMode.MAX_THROUGHPUT,
        "batcher.mode",
        str(batcher.mode),
        f"engine {engine.name} schedules every step within one token budget "
        "(batcher=max_throughput, as captured); another mode is engine=default's",
    )
    if not measuring:  # validate: the replay is the measurement
        _check_fitted_gpu(engine, gpu, tp)


def _check_fitted_gpu(e: EngineConfig, gpu: GpuSpecConfig, tp: int) -> None:
    """A fitted step cost has no hardware terms: it runs unchanged only on a GPU whose captures
    it was replayed against (conf/trust.json: the GPU it was fitted on, or one it was
    transferred to with its errors committed); elsewhere it is refused."""
    require(
        tp == 1,
        "tp",
        tp,
        f"engine {e.name}'s fitted step cost was measured on one GPU: use tp=1 or "
        "engine=default (unvalidated)",
    )
    hit = trust_registry.measurement_for(e.name, gpu)
    if hit is not None and hit.fitted_on == e.fitted_on:
        return
    never_validated = not trust_registry.measured_gpus(e.name)
    if never_validated and gpu.figures() == GpuSpecConfig().figures():
        return  # a new fit, before its errors are committed: the H200 only, as before
    floor = trust_registry.transfer_floor(e.name)
    bound = f"at least ±{100 * floor:.1f} % (its measured transfer)" if floor else "unknown"
    measured = ", ".join(trust_registry.measured_gpus(e.name)) or "none"
    require(
        False,
        "gpu",
        gpu.name,
        f"engine {e.name}'s step cost was fitted on {e.fitted_on or 'an unnamed GPU'} and has "
        f"real-engine errors on gpu {measured} only (conf/trust.json); here it would be "
        f"datasheet only, error {bound}: use one of those GPUs, capture this one, or "
        "engine=default (unvalidated)",
    )
