"""How long one engine step takes: the batcher's step-cost port, chosen by the engine profile.

`RooflineStepCost` is the project's own engine model (cost/model.py over the hardware section);
`FittedStepCost` is a real engine's step time fitted from its micro-runs (cost/engine_step.py);
`PhysicalStepCost` the same engine's kernels on a measured GPU profile (cost/step_physical.py).
The batcher calls the port and never asks which engine it imitates.
"""

from __future__ import annotations

from operator import mul
from typing import Protocol

import numpy as np

from cachepilot_sim.config import SimConfig, StepCost
from cachepilot_sim.config.base import ConfigError
from cachepilot_sim.cost import ComputeFit, batch_iteration_us, decode_step_slope_us, iteration_us
from cachepilot_sim.cost.engine_step import EngineStepFit, decode_run_us, engine_step_us
from cachepilot_sim.cost.gpu_profile import check_model
from cachepilot_sim.cost.profile_scaling import engine_hardware_profile
from cachepilot_sim.cost.step_physical import (
    PaddingRules,
    PhysicalFit,
    PhysicalStepModel,
    batch_shape,
    decode_shapes,
)

EXACT = 1 << 53  # integers below this are exact in float64, so their float sums are too


class StepCostModel(Protocol):
    """Step durations in microseconds, before rounding up to whole microseconds."""

    def iteration_us(
        self, new: np.ndarray, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray
    ) -> float:
        """One step; per request: tokens computed now, KV tokens held, KV bytes per token and
        model index."""
        ...

    def iteration_us_ints(
        self, new: list[int], ctx: list[int], tok_bytes: list[int]
    ) -> float | None:
        """`iteration_us` of one model's batch from plain ints, the same float; None where the
        model cannot promise that (the caller then builds the arrays)."""
        ...

    def decode_run_us(
        self, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray, num_steps: int
    ) -> np.ndarray:
        """`num_steps` pure-decode steps of one unchanged batch whose contexts grow by one."""
        ...


class RooflineStepCost:
    """The project's engine model: weights and KV read at HBM speed plus dense and attention
    compute (cost/model.py); linear in context, so a decode run is first + j x slope."""

    def __init__(self, fit: ComputeFit, weight_bytes: list[float]) -> None:
        self.fit = fit
        self.weight_bytes = weight_bytes

    def iteration_us(
        self, new: np.ndarray, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray
    ) -> float:
        """One step: each model present runs its forward pass (cost.batch_iteration_us)."""
        return batch_iteration_us(self.fit, self.weight_bytes, new, ctx, tok_bytes, model)

    def iteration_us_ints(
        self, new: list[int], ctx: list[int], tok_bytes: list[int]
    ) -> float | None:
        """One model's step from its three sums, taken over ints: the array path's float sums
        are of integers (tokens, KV bytes) and half-integers (attention pairs) and exact below
        2^53, in any order, so this is the same float. None for several models or larger sums."""
        if len(self.weight_bytes) != 1:
            return None
        kv_read = sum(map(mul, ctx, tok_bytes))
        pairs2 = sum([x * (2 * c + x) for x, c in zip(new, ctx, strict=True)])  # 2 x pairs
        if kv_read >= EXACT or pairs2 >= EXACT:
            return None
        tokens = float(sum(new))
        return iteration_us(self.fit, self.weight_bytes[0], tokens, float(kv_read), pairs2 / 2)

    def decode_run_us(
        self, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray, num_steps: int
    ) -> np.ndarray:
        """First step priced in full, then + j x slope (cost is linear in context)."""
        n = ctx.size
        if len(self.weight_bytes) > 1:
            first = self.iteration_us(np.ones(n), ctx, tok_bytes, model)
            slope = decode_step_slope_us(self.fit, float(tok_bytes.sum()), n)
        else:  # integer sums (exact, like NumPy's int64 ones) over lists: cheaper on small batches
            c, t = ctx.tolist(), tok_bytes.tolist()
            kv_read = float(sum(map(mul, c, t)))
            first = iteration_us(
                self.fit, self.weight_bytes[0], n, kv_read, float(sum(c)) + 0.5 * n
            )
            slope = decode_step_slope_us(self.fit, float(sum(t)), n)
        return first + slope * np.arange(num_steps)


class FittedStepCost:
    """A real engine's step time over its padded launch shape (cost/engine_step.py)."""

    def __init__(self, fit: EngineStepFit) -> None:
        self.fit = fit

    def iteration_us(
        self, new: np.ndarray, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray
    ) -> float:
        """One step over its padded launch shape (cost.engine_step.engine_step_us)."""
        return engine_step_us(self.fit, new, ctx)

    def iteration_us_ints(
        self, new: list[int], ctx: list[int], tok_bytes: list[int]
    ) -> float | None:
        """None: the padded-shape model takes the arrays (`iteration_us`)."""
        return None

    def decode_run_us(
        self, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray, num_steps: int
    ) -> np.ndarray:
        """Each step priced over its padded shape (cost.engine_step.decode_run_us)."""
        return decode_run_us(self.fit, ctx, num_steps)


class PhysicalStepCost:
    """A CUDA-graph engine's kernels on a measured GPU at its padded launch shape, scaled by
    constants fitted from its micro-runs (cost/step_physical.py)."""

    def __init__(self, model: PhysicalStepModel) -> None:
        self.model = model

    def iteration_us(
        self, new: np.ndarray, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray
    ) -> float:
        """One step over its padded shape; an empty step costs nothing."""
        if new.size == 0:
            return 0.0
        return float(self.model.steps_us(batch_shape(self.model.rules, new, ctx))[0])

    def iteration_us_ints(
        self, new: list[int], ctx: list[int], tok_bytes: list[int]
    ) -> float | None:
        """None: the physical model takes the arrays (`iteration_us`)."""
        return None

    def decode_run_us(
        self, ctx: np.ndarray, tok_bytes: np.ndarray, model: np.ndarray, num_steps: int
    ) -> np.ndarray:
        """Each step priced over its padded shape, as `iteration_us` prices it."""
        return self.model.steps_us(decode_shapes(self.model.rules, ctx, num_steps))


def physical_step_model(cfg: SimConfig) -> PhysicalStepModel:
    """The physical step model of `cfg`'s engine profile: reads engine.gpu_profile (the only
    file read) and refuses a profile measured for another model geometry."""
    e = cfg.engine
    if len(cfg.models) != 1:
        raise ConfigError(
            f"config key 'extra_models' = {len(cfg.models) - 1} extra model(s): "
            "step_cost=physical prices one model's engine"
        )
    profile, _ = engine_hardware_profile(e.gpu_profile, cfg.gpu)  # on the run's GPU
    m = cfg.model
    check_model(profile, m.num_kv_heads, m.head_dim, m.num_attention_heads)
    rules = PaddingRules(
        q_pad_tokens=e.q_pad_tokens,
        kv_pad_tokens=e.kv_pad_tokens,
        max_batch_tokens=cfg.batcher.throughput_token_budget,
        max_kv_tokens=e.kv_pool_blocks * cfg.kv.block_tokens,
        max_seqs=cfg.batcher.throughput_max_seqs,
        kernels=e.physical_kernels,
        graph_sizes=tuple(e.graph_sizes),
    )
    fit = PhysicalFit(
        e.physical_overhead_us,
        e.physical_request_us,
        e.physical_gemm_scale,
        e.physical_kv_copy_scale,
        e.physical_attention_scale,
        e.physical_elementwise_scale,
        e.physical_grid_block_ns,
        e.physical_eager_floor_us,
    )
    return PhysicalStepModel(profile, m.num_layers, rules, fit)


def make_step_cost(cfg: SimConfig, fit: ComputeFit) -> StepCostModel:
    """The step-cost port the engine profile asks for."""
    e = cfg.engine
    if e.step_cost == StepCost.PHYSICAL:
        return PhysicalStepCost(physical_step_model(cfg))
    if e.step_cost == StepCost.FITTED:
        return FittedStepCost(
            EngineStepFit(
                e.const_us,
                e.q_padded_token_us,
                e.kv_read_token_us,
                e.kv_read_token2_us,
                e.seqlen_us,
                e.seqlen_per_sqrt_request_us,
                e.prefill_seqlen_us,
                e.request_us,
                e.q_pad_tokens,
                tuple(float(v) for v in e.q_shape_us),
            )
        )
    return RooflineStepCost(fit, [float(m.weight_bytes) for m in cfg.models])
