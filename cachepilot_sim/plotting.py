"""What every figure shares: one colour per eviction policy, the same in every figure (a fixed
order over the registered policies, not the order a run happens to list them in), grey for the
policies a figure does not single out, and the columns seaborn draws from, handed over as numpy
arrays: seaborn 0.13 rejects polars frames, and a dict of arrays spares the pandas/pyarrow
conversion of `DataFrame.to_pandas` (seaborn builds its own pandas frame from the dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

STYLES = ("-", "--", "-.", ":")  # line styles and markers: hues stay apart in greyscale
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
GREY = "#b0b0b0"  # the policies not singled out (beyond a figure's top k)
# Tableau 20 (matplotlib's tab20, dark shades first): 20 distinct colours, one per policy.
_TAB20 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
# The policies most answers show keep the first colours whatever else is registered.
FIRST = ("lru", "perc", "perc_hazard", "fifo", "lfu", "priority", "s3fifo", "sieve", "arc", "gdsf")


def policy_colour(policy: str) -> str:
    """The colour of `policy` in every figure (a policy registered later takes the next free
    colour in name order; beyond 20 policies, colours repeat)."""
    from cachepilot_sim.config import POLICIES

    order = list(FIRST) + sorted(set(POLICIES.names()) - set(FIRST))
    if policy not in order:
        order.append(policy)
    return _TAB20[order.index(policy) % len(_TAB20)]


def policy_palette(
    policies: Sequence[str], highlight: Sequence[str] | None = None
) -> dict[str, str]:
    """policy -> colour for a figure's policies; with `highlight`, every other policy is grey."""
    keep = set(policies if highlight is None else highlight)
    return {p: policy_colour(p) if p in keep else GREY for p in policies}


def top_k(values: dict[str, float], k: int, higher_is_better: bool = False) -> list[str]:
    """The k best policies by a metric (ties by name), the ones a figure colours."""
    sign = -1.0 if higher_is_better else 1.0
    return [p for p, _ in sorted(values.items(), key=lambda kv: (sign * kv[1], kv[0]))[:k]]


def seaborn_data(frame: pl.DataFrame) -> dict[str, Any]:
    """A polars frame as seaborn's `data=`: column name -> numpy array."""
    return {name: frame[name].to_numpy() for name in frame.columns}


def style(i: int, name: str = "") -> dict[str, object]:
    """Line style and marker of the i-th hue (distinct even in greyscale); a registered policy's
    own colour, the same in every figure (plotting.policy_colour), else the i-th cycle colour."""
    from cachepilot_sim.config import POLICIES

    return {
        "color": policy_colour(name) if name in POLICIES.names() else f"C{i}",
        "linestyle": STYLES[i % 4],
        "marker": MARKERS[i % len(MARKERS)],
    }


def lowest_ttft_p99(requests: pl.DataFrame, k: int) -> list[str]:
    """The k policies with the lowest TTFT p99 over completed requests (all configurations)."""
    done = requests.filter(pl.col("outcome") == "completed")
    p99 = done.group_by("policy").agg(pl.col("ttft_us").quantile(0.99, "linear"))
    return top_k(dict(zip(p99["policy"].to_list(), p99["ttft_us"].to_list(), strict=True)), k)
