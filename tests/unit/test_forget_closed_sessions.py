"""The session manager forgets a closed session's record once it holds no KV (memory only).

A 10^7-request synthetic run kept one `SessionKV` and `CacheEntry` per session ever seen (about
a quarter of a kilobyte each, one session per 2-4 requests). The clients now say when a session
sends no more turns, and the manager drops its record when its KV is gone. Nothing may change
but memory: every registered policy gives the same metrics, per-request table and event trace
with forgetting on and off, also with a CPU store small enough to drop KV.
"""

from __future__ import annotations

from typing import Any

import pytest

from cachepilot_sim.components.kv import SessionKvManager, Tier
from cachepilot_sim.config import KVConfig, policy_config
from cachepilot_sim.config.policy import POLICIES
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload

GIB = 1 << 30


def _run(policy: str, forget: bool, cpu_store_gib: float) -> tuple[Any, SessionKvManager]:
    cfg = make_sim_config(
        policy=policy_config(policy),
        workload=make_workload(num_requests=160),
        kv=KVConfig(cpu_store_bytes=int(cpu_store_gib * GIB)),
    )
    sim = build(cfg)
    kv = sim.kv
    assert isinstance(kv, SessionKvManager)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SessionKvManager, "forget_closed", forget)
        result = sim.run()
    return result, kv


@pytest.mark.parametrize("policy", sorted(POLICIES.names()))
def test_forgetting_closed_sessions_changes_no_result(policy: str) -> None:
    kept, kept_kv = _run(policy, forget=False, cpu_store_gib=2.0)
    gone, gone_kv = _run(policy, forget=True, cpu_store_gib=2.0)
    drop = ("run_id",)
    assert {k: v for k, v in gone.metrics.items() if k not in drop} == {
        k: v for k, v in kept.metrics.items() if k not in drop
    }
    assert gone.requests.equals(kept.requests)
    assert gone.trace.equals(kept.trace)
    assert len(gone_kv.sessions) < len(kept_kv.sessions)


def test_what_is_left_holds_kv_or_may_come_back() -> None:
    """At the end every session has closed; a record left holds KV (idle on the GPU, in the CPU
    store or in flight), and the CPU store's drops forgot the records they emptied."""
    result, kv = _run("perc", forget=True, cpu_store_gib=1.0)
    assert result.metrics["cpu_drops"] > 0
    started = result.requests["session"].unique().to_list()
    assert len(started) > len(kv.sessions)
    for s in kv.sessions.values():
        assert s.closed
        assert s.tier != Tier.NONE and not s.active
    assert sum(s.num_bytes for s in kv.sessions.values() if s.tier == Tier.GPU) == kv.idle_bytes


def test_every_session_that_started_is_closed_once() -> None:
    """Last turn answered, or the budget spent before its next turn: closed, once each."""
    cfg = make_sim_config(workload=make_workload(num_requests=160))
    sim = build(cfg)
    closed: list[int] = []
    sim.clients.on_session_end.append(closed.append)  # type: ignore[union-attr]
    result = sim.run()
    assert sorted(closed) == sorted(set(closed))
    # Sessions that got their slot after the request budget was spent send nothing and close.
    assert set(result.requests["session"].to_list()) < set(closed)
    assert len(closed) <= sim.clients.num_sessions
