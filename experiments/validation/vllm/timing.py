"""What vLLM 0.26's serving timeline adds to a step's cost, read off a capture folder (nothing
fitted; docs/vllm.md, "Fitted and validated"): the AsyncLLM front end's two paths, the eager
steps' host launch in each serving run, and how often a first token waits for the next step's
eager launch (under async scheduling the engine core takes step n's output only after it launched
step n+1).

    PYTHONPATH=. python experiments/validation/vllm/timing.py \
        experiments/validation/vllm/2026-12-07-h100
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

WORKLOADS = ("poisson_r6", "poisson_r9", "multiturn", "shared_prompt", "burst_4x", "closed_b64")


def front_end(root: Path) -> None:
    """Input path: send to the engine core's queue for the first request of each micro-run
    configuration (the engine idle), and its line in the prompt length (engine.frontend_in_us,
    frontend_in_token_us); output path: the engine's first-token stamp to the client, its median
    over the micro-runs of at most 8 requests (engine.frontend_out_us), then per workload."""
    firsts, outs = [], []
    for plan in ("microbench", "microbench_mixed"):
        r = pl.read_parquet(root / plan / "micro_requests.parquet")
        first = r.sort("send_us").group_by("config_id", "rep").first()
        path = (first["engine_created_us"] - first["send_us"]).median()
        print(f"input path, {plan}: median {path / 1e3:.1f} ms ({first.height} configurations)")
        firsts.append(first)
        few = r.filter(pl.col("batch_size") <= 8)
        outs.append((few["first_token_us"] - few["engine_first_token_us"]).to_numpy())
    first = pl.concat(firsts)
    x = first["prompt_tokens"].to_numpy().astype(np.float64)
    y = (first["engine_created_us"] - first["send_us"]).to_numpy().astype(np.float64)
    a, b = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), y, rcond=None)[0]
    out = float(np.median(np.concatenate(outs)))
    print(f"front end fit: frontend_in_us {float(a)!r}, frontend_in_token_us {float(b)!r}, "
          f"frontend_out_us {round(out)} ({x.size} first requests)")  # fmt: skip
    for w in WORKLOADS:
        r = pl.read_parquet(root / w / "run1" / "requests.parquet")
        out = (r["first_token_us"] - r["engine_first_token_us"]).median()
        print(f"output path, {w}: median {out / 1e3:.1f} ms")


def eager_launches(root: Path) -> None:
    """The host launch of every eager step that follows a graph step: the previous step's output
    waited for it (its update start) since this step's schedule end."""
    for w in WORKLOADS:
        for run in ("run1", "run2"):
            s = pl.read_parquet(root / w / run / "steps.parquet").sort("step")
            eager = s["q_tokens"] != s["num_requests"]
            launch = s["update_start_us"].shift(1) - s["prepare_end_us"]
            after_graph = eager & ~eager.shift(1, fill_value=True)
            values = launch.filter(after_graph).drop_nulls().to_numpy()
            if values.size:
                print(f"eager launch, {w}/{run}: median {np.median(values) / 1e3:.1f} ms "
                      f"({values.size} steps)")  # fmt: skip


def first_token_waits(root: Path) -> None:
    """Per workload (run 1): first tokens whose step was followed by an eager step, and the
    mean wait for that step's launch over all requests, beside the TTFT mean."""
    for w in WORKLOADS:
        s = pl.read_parquet(root / w / "run1" / "steps.parquet").sort("step")
        r = pl.read_parquet(root / w / "run1" / "requests.parquet")
        ready = s["update_start_us"].to_numpy()
        prepared = s["prepare_end_us"].to_numpy()
        eager = (s["q_tokens"] != s["num_requests"]).to_numpy()
        waits = []
        for t in r["engine_first_token_us"].to_numpy():
            i = int(np.searchsorted(ready, t, side="right")) - 1
            if 0 <= i < len(ready) - 1:
                waits.append(ready[i] - prepared[i + 1] if eager[i + 1] else 0.0)
        wait = np.array(waits)
        ttft = (r["first_token_us"] - r["send_us"]).mean()
        print(f"first tokens after an eager launch, {w}: {int((wait > 0).sum())}/{wait.size}, "
              f"mean wait {wait.mean() / 1e3:.1f} ms of TTFT mean {ttft / 1e3:.1f} ms "
              f"({wait.mean() / ttft:.0%})")  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: timing.py CAPTURE_FOLDER (e.g. experiments/validation/vllm/2026-12-07-h100)",
              file=sys.stderr)  # fmt: skip
        return 2
    root = Path(argv[0])
    front_end(root)
    eager_launches(root)
    first_token_waits(root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
