"""Running an experiment around the simulation: what `python -m cachepilot_sim` imports.

`runner` runs a config's (policy, seed) cells and writes the results (`serving` computes the
latency and throughput figures, `answer` lays out the tables, `report` writes the one-page report);
`sweep` makes Hydra multirun
jobs survive each other; `offline` is the LP bound a run can add; `telemetry` writes the Prometheus
exposition and serves live progress. Only `__main__` and `tools/` import this package, and nothing
here imports `cachepilot_sim.tools` (tests/unit/test_import_graph.py checks both).
"""
