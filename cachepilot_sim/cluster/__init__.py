"""Beyond one GPU: engine replicas on one SimPy clock, the router that places requests on them
(strategies registered by name in `routers.py`), and the cluster simulation that runs them.

Importing this package registers the routers only; the simulation lives in `simulation.py`.
"""

from cachepilot_sim.cluster import routers  # noqa: F401  (registers the named routers)
