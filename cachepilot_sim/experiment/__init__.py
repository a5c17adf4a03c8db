"""Running an experiment around the simulation: what `python -m cachepilot_sim` imports.

`runner` runs a config's (policy, seed) cells and writes the results; `sweep` makes Hydra multirun
jobs survive each other; `metrics` defines the per-request table and the run metrics over it (the
one implementation: `trace/derive.py` calls it too); `offline` is the LP bound a run can add;
`telemetry` writes the Prometheus exposition and serves live progress. Nothing here imports
`cachepilot_sim.tools` (tests/unit/test_import_graph.py checks it).
"""
