"""The Grafana dashboard (JSON model) over what a run serves: the progress gauges and the live
metrics of experiment/live.py (simulated-time gauges, counters, histograms). Every panel's PromQL
names only metrics that a run publishes while it goes on (tests/unit/test_live_metrics.py scrapes
a run mid-way and finds each one); latency percentiles come from the histograms
(`histogram_quantile` over the buckets so far: the distribution since the cell started).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SEL = '{policy=~"$policy"}'
CELL = "{{policy}} s{{seed}}"  # legend of one cell


def _quantiles(name: str) -> list[tuple[str, str]]:
    """p50 / p95 / p99 of a live histogram over every observation so far."""
    return [
        (
            f"histogram_quantile({q}, sum by (le, policy, seed) "
            f"(cachepilot_sim_{name}_bucket{SEL}))",
            f"p{round(q * 100)} {CELL}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


# (title, unit, [(PromQL, legend)]): one timeseries panel each, two per row.
PANELS: tuple[tuple[str, str, list[tuple[str, str]]], ...] = (
    ("Simulated time", "s", [(f"cachepilot_progress_sim_seconds{SEL}", CELL)]),
    (
        "Requests done / total",
        "short",
        [
            (f"cachepilot_progress_requests_done{SEL}", f"done {CELL}"),
            (f"cachepilot_progress_requests_total{SEL}", f"total {CELL}"),
        ],
    ),
    (
        "Events per wall second",
        "short",
        [(f"cachepilot_progress_events_per_wall_second{SEL}", CELL)],
    ),
    (
        "Realized restore seconds (reload, recompute)",
        "s",
        [(f"cachepilot_sim_restore_seconds_total{SEL}", f"{{{{kind}}}} {CELL}")],
    ),
    (
        "Expected eviction cost (seed metric)",
        "s",
        [(f"cachepilot_sim_expected_evict_cost_seconds_total{SEL}", CELL)],
    ),
    (
        "Evicted bytes",
        "bytes",
        [(f"cachepilot_sim_evicted_bytes_total{SEL}", f"{{{{action}}}} {CELL}")],
    ),
    ("TTFT percentiles (so far)", "s", _quantiles("ttft_seconds")),
    ("TPOT percentiles (so far)", "s", _quantiles("tpot_seconds")),
    ("E2E latency percentiles (so far)", "s", _quantiles("e2e_seconds")),
    (
        "Goodput (requests within SLO per simulated second)",
        "reqps",
        [(f"cachepilot_sim_slo_met_total{SEL} / cachepilot_sim_time_seconds{SEL}", CELL)],
    ),
    (
        "SLA attainment",
        "percentunit",
        [
            (
                f"cachepilot_sim_slo_met_total{SEL} / "
                f"sum without (outcome) (cachepilot_sim_requests_total{SEL})",
                CELL,
            )
        ],
    ),
    (
        "KV utilisation per tier",
        "percentunit",
        [(f"cachepilot_sim_kv_utilization{SEL}", f"{{{{tier}}}} {CELL}")],
    ),
    (
        "Queue depth and running batch",
        "short",
        [
            (f"cachepilot_sim_queue_depth{SEL}", f"queued {CELL}"),
            (f"cachepilot_sim_running_requests{SEL}", f"running {CELL}"),
        ],
    ),
    (
        "PCIe traffic",
        "bytes",
        [(f"cachepilot_sim_pcie_bytes_total{SEL}", f"{{{{direction}}}} {CELL}")],
    ),
    (
        "PCIe busy (so far)",
        "percentunit",
        [
            (
                f"cachepilot_sim_pcie_busy_seconds_total{SEL} / ignoring (direction) "
                f"group_left cachepilot_sim_time_seconds{SEL}",
                f"{{{{direction}}}} {CELL}",
            )
        ],
    ),
    (
        "Cache outcomes and evictions",
        "short",
        [(f"cachepilot_sim_kv_events_total{SEL}", f"{{{{event}}}} {CELL}")],
    ),
)


def _panel(pid: int, title: str, unit: str, queries: Sequence[tuple[str, str]]) -> dict:
    targets = [
        {"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(queries)
    ]
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": "${datasource}",
        "gridPos": {"h": 8, "w": 12, "x": 12 * ((pid - 1) % 2), "y": 8 * ((pid - 1) // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": targets,
    }


def grafana_dashboard() -> dict[str, Any]:
    """A Grafana dashboard (JSON model): progress and the live simulated-time metrics."""
    panels = [_panel(i + 1, title, unit, q) for i, (title, unit, q) in enumerate(PANELS)]
    templating = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {
            "name": "policy",
            "type": "query",
            "datasource": "${datasource}",
            "includeAll": True,
            "multi": True,
            "query": "label_values(cachepilot_sim_time_seconds, policy)",
            "current": {"text": "All", "value": "$__all"},
        },
    ]
    return {
        "title": "CachePilot-Sim",
        "uid": "cachepilot-sim",
        "schemaVersion": 39,
        "tags": ["cachepilot"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": templating},
        "panels": panels,
    }


def panel_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name that a panel's or a template variable's PromQL refers to."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {n for e in exprs for n in re.findall(r"\bcachepilot_[a-zA-Z0-9_]+", e)}
