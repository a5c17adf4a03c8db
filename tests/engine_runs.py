"""Small deterministic runs of the transformers profile (engine=hf_cb) over a synthetic request
list: `ground_truth(prompts, outputs, sends)` and `run_hf_cb(gt, *overrides)`."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from cachepilot_sim.result import SimResult
from cachepilot_sim.sim import Simulation, build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruth
from cachepilot_sim.validation.replay import workload_from_ground_truth


def ground_truth(prompts: list[int], outputs: list[int], sends_us: list[int]) -> GroundTruth:
    """A request list (no parents, no shared prefixes) in the ground-truth shape."""
    n = len(prompts)
    frame = pl.DataFrame(
        {
            "request_id": [f"r{i:03d}" for i in range(n)],
            "send_us": sends_us,
            "prompt_tokens": prompts,
            "output_tokens": outputs,
            "first_token_us": [0] * n,
            "end_us": [0] * n,
            "status": ["finished"] * n,
        }
    )
    return GroundTruth(Path("synthetic"), frame, None, {})


def run_hf_cb(
    gt: GroundTruth, *overrides: str, trace_dir: Path | None = None
) -> tuple[Simulation, SimResult]:
    """Replay `gt` on the hf_cb profile with `overrides`; the simulation and its result."""
    extra = ["trace.enabled=true", "trace.iteration_every=1"] if trace_dir else []
    run_cfg = sim_config("hf_cb", [*extra, *overrides])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    sim = build(cfg, trace_dir, workload)
    return sim, sim.run()


def pressure(num_requests: int = 24, prompt_tokens: int = 300) -> GroundTruth:
    """Long replies sent 40 ms apart: into a 12-block pool, decodes run out of blocks."""
    n = num_requests
    prompts = [prompt_tokens + 37 * (i % 7) for i in range(n)]
    outputs = [200 + 53 * (i % 5) for i in range(n)]
    return ground_truth(prompts, outputs, [i * 40_000 for i in range(n)])
