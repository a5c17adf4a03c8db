"""CachePilot-Sim: a discrete-event simulator of KV-cache management in LLM serving.

Importing the package registers every eviction policy, admission controller and router, with its
config class, in config's registries: a config can then be validated (and Hydra's schema stored)
before anything else is imported. None of them imports the others' consumers, so this is no
cycle.
"""

from cachepilot_sim import admission, cluster, policies  # noqa: F401  (registers the named choices)
