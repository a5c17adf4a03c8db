"""Hydra entry point: `python -m cachepilot_sim +experiment=...` (the console command
`cachepilot-sim` runs the same, tools/cli.py). The only DictConfig user.

Configs are packaged in cachepilot_sim/conf (config_path below is relative to this file, so an
installed package finds them too).

`--multirun` sweeps run each job through `sweep.run_job` (crash isolation, resume); see
docs/observability.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from cachepilot_sim.conf import groups_help
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.experiment.lifecycle import exit_status, install_signal_handlers
from cachepilot_sim.experiment.outdir import OutputDirError
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.sweep import safe_dirname
from cachepilot_sim.workloads.traces import TraceError

register_configs()
# `--help` lists the groups a run can pick through this resolver (conf/hydra/help/cachepilot.yaml).
OmegaConf.register_new_resolver("cachepilot_groups", groups_help, replace=True)
# Job folders are named by their overrides; this keeps each one inside the sweep folder.
OmegaConf.register_new_resolver("cp_safe_dirname", safe_dirname, replace=True)


def refuse_ignored_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """`policy=X` does nothing when the experiment compares policies: refuse, naming both keys."""
    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "policy"]
    if chosen and cfg.get("compare_policies"):
        names = list(cfg.compare_policies)
        raise ConfigError(
            f"{chosen[0]} is ignored because compare_policies={names} is set; use "
            f"compare_policies=[{chosen[0].split('=', 1)[1]}] (or compare_policies=[] to run "
            "that policy alone)"
        )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from cachepilot_sim.experiment.sweep import run_job

        overrides = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task) or []]
        run_job(cfg, out_dir, overrides, int(hydra_cfg.job.num), Path(hydra_cfg.sweep.dir))
        return
    try:
        refuse_ignored_overrides(cfg, [str(o) for o in hydra_cfg.overrides.task])
        run_cfg = to_config(cfg)
    except ConfigError as err:
        model_file = str(hydra_cfg.runtime.choices.get("model", "<name>"))
        message = str(err).replace("model/<name>.yaml", f"model/{model_file}.yaml")
        print(f"cachepilot_sim: invalid configuration: {message}", file=sys.stderr)
        sys.exit(2)
    install_signal_handlers()  # SIGTERM/SIGHUP stop the run as SIGINT does
    try:
        run_experiment(run_cfg, out_dir)
    except TraceError as err:  # a bad trace row: file, line and reason, no traceback
        print(f"cachepilot_sim: cannot replay the trace: {err}", file=sys.stderr)
        sys.exit(2)
    except OutputDirError as err:  # an unusable hydra.run.dir: named, no traceback
        print(f"cachepilot_sim: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as err:  # SIGINT, SIGTERM, SIGHUP: workers stopped, files whole
        print(
            f"cachepilot_sim: {err or 'stopped by SIGINT'}; a rerun into {out_dir} replaces "
            "what this run wrote",
            file=sys.stderr,
        )
        sys.exit(exit_status(err))
    except Exception as err:  # a value that passed validation but broke the run
        if os.environ.get("CACHEPILOT_TRACEBACK"):
            raise
        first = (str(err).strip().splitlines() or [""])[0]
        print(
            f"cachepilot_sim: the run failed: {type(err).__name__}: {first} "
            "(CACHEPILOT_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        sys.exit(2)
    print(f"results: {out_dir}")


if __name__ == "__main__":
    main()
