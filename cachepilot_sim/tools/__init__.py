"""Commands a user runs apart from a simulation run, each `cachepilot-sim <name>` (`cli` is the
console command and its dispatch table; `python -m cachepilot_sim.tools.<module>` works too).

On results: `plot` (figures of a run or a sweep, drawn by `figures`), `collect` (a sweep's jobs in
one table). On hardware and data: `scorecard`, `calibrate`, `profile_dataset`, `vllm_bench`; on a
real engine: `validate`, `fit_engine`. Training: `train_admission`. Tools import the rest of the
package; nothing outside `tools/` imports a tool (tests/unit/test_import_graph.py checks it).
"""

# The packaged Hydra config tree (model, gpu, hardware and experiment files the tools read).
from cachepilot_sim.conf import CONF_DIR

__all__ = ["CONF_DIR"]
