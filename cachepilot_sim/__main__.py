"""Hydra entry point: `python -m cachepilot_sim +experiment=...`. The only DictConfig user.

`--multirun` sweeps run each job through `sweep.run_job` (crash isolation, resume); see
docs/observability.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.experiment.outdir import OutputDirError
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.sweep import safe_dirname
from cachepilot_sim.workloads.traces import TraceError

register_configs()
# Job folders are named by their overrides; this keeps each one inside the sweep folder.
OmegaConf.register_new_resolver("cp_safe_dirname", safe_dirname, replace=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from cachepilot_sim.experiment.sweep import run_job

        overrides = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task) or []]
        run_job(cfg, out_dir, overrides, int(hydra_cfg.job.num), Path(hydra_cfg.sweep.dir))
        return
    try:
        run_cfg = to_config(cfg)
    except ConfigError as err:
        print(f"cachepilot_sim: invalid configuration: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        run_experiment(run_cfg, out_dir)
    except TraceError as err:  # a bad trace row: file, line and reason, no traceback
        print(f"cachepilot_sim: cannot replay the trace: {err}", file=sys.stderr)
        sys.exit(2)
    except OutputDirError as err:  # an unusable hydra.run.dir: named, no traceback
        print(f"cachepilot_sim: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"results: {out_dir}")


if __name__ == "__main__":
    main()
