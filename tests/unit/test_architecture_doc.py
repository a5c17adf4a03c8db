"""docs/architecture.md lists each component's ports; this keeps the table true to the code."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from cachepilot_sim.components.admission_gate import AdmissionGate
from cachepilot_sim.components.kv import KvDeps
from cachepilot_sim.components.ports import EnginePorts
from cachepilot_sim.components.scheduler import RequestQueue, Scheduler

DOC = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
PORTS = DOC[DOC.index("## Ports") : DOC.index("## The KV package")]


def test_every_constructor_parameter_of_a_component_is_in_the_ports_table() -> None:
    for cls in (RequestQueue, Scheduler, AdmissionGate):
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        row = f"({', '.join(params)})"
        assert row in PORTS, f"{cls.__name__}{row} is not the constructor the table shows"


def test_every_port_bundle_field_is_named_in_the_ports_table() -> None:
    for bundle in (KvDeps, EnginePorts):
        for field in dataclasses.fields(bundle):
            assert field.name in PORTS, f"{bundle.__name__}.{field.name} missing from the table"
