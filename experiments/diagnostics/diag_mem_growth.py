"""Memory diagnosis (not a test): which Python objects a mixed_spike/PERC run of N requests still
holds at its end, by type (count and shallow size of every GC-tracked object), the KV manager's
and clients' large containers, and the size of the per-request metric frame; with the process's
peak RSS. Run it at two N and compare.

    PYTHONPATH=. python experiments/diagnostics/diag_mem_growth.py 25000
    PYTHONPATH=. python experiments/diagnostics/diag_mem_growth.py 100000
"""

import collections
import gc
import resource
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.sim import build

register_configs()
conf = Path("cachepilot_sim/conf").resolve()
N = int(sys.argv[1])
with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
    cfg = to_config(
        compose(
            "config",
            overrides=[
                "+experiment=mixed_spike",
                f"workload.num_requests={N}",
                "seeds=1",
                "compare_policies=[perc]",
                "policy=perc",
            ],
        )
    )
out = Path(tempfile.mkdtemp())
sim = build(cfg, out / "trace", None, out / "requests.parquet")
sim.run()
gc.collect()
cnt = collections.Counter()
size = collections.Counter()
for o in gc.get_objects():
    t = (
        str(getattr(type(o), "__module__", ""))
        + "."
        + str(getattr(type(o), "__qualname__", type(o)))
    )
    cnt[t] += 1
    size[t] += sys.getsizeof(o)
print("N", N, "maxrss MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
for t, s in size.most_common(25):
    print(f"{t:60s} {cnt[t]:>10d} {s / 2**20:8.1f} MiB")
kv = sim.kv
for name in dir(kv):
    v = getattr(kv, name, None)
    if isinstance(v, (dict, list, set)) and len(v) > 1000:
        print("kv." + name, len(v))
cl = sim.clients
for name in dir(cl):
    v = getattr(cl, name, None)
    try:
        if hasattr(v, "__len__") and not isinstance(v, str) and len(v) > 1000:
            print("clients." + name, len(v))
    except TypeError:  # a property without a length
        pass
est = sim.estimator
for name in dir(est):
    v = getattr(est, name, None)
    if isinstance(v, (dict, list, set)) and len(v) > 1000:
        print("estimator." + name, len(v))
print("log metric frame MiB", sim.log.metric_frame().estimated_size() / 2**20)
