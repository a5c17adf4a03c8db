from __future__ import annotations

from collections.abc import Generator

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.scheduler import RequestQueue
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.config import SchedulerConfig


def make_scheduler(env: SimEnvironment, **kw: float) -> RequestQueue:
    return RequestQueue(env, SchedulerConfig(**kw), Signal(env))


def make_request(
    env: SimEnvironment, rid: int, priority: int, arrival: int, deadline: int
) -> Request:
    return Request(env, rid, rid, 0, 0, 0, priority, arrival, deadline, 1, 0, 10, 10)


def drain(s: RequestQueue) -> list[int]:
    out = []
    while (req := s.peek()) is not None:
        s.pop(req)
        out.append(req.req_id)
    return out


def test_higher_priority_first_then_arrival_order() -> None:
    env = SimEnvironment()
    s = make_scheduler(env, promote_slack_ms=0)
    for rid, prio, arrival in ((0, 1, 0), (1, 3, 5), (2, 1, 1), (3, 3, 2)):
        s.push(make_request(env, rid, prio, arrival, 10**9))
    assert drain(s) == [3, 1, 0, 2]


def test_request_near_its_ttft_deadline_is_promoted_over_higher_priority() -> None:
    env = SimEnvironment()
    s = make_scheduler(env, promote_slack_ms=100)
    s.push(make_request(env, 0, 5, 0, 10**9))
    s.push(make_request(env, 1, 0, 0, 50_000))  # deadline in 50 ms: within the 100 ms slack
    assert drain(s) == [1, 0]
    assert s.num_promoted == 1


def test_requeued_requests_go_first() -> None:
    env = SimEnvironment()
    s = make_scheduler(env)
    s.push(make_request(env, 0, 5, 0, 10**9))
    back = make_request(env, 1, 0, 0, 10**9)
    s.requeue_front(back)
    assert drain(s) == [1, 0]


def test_a_request_waiting_past_the_queue_timeout_is_expired() -> None:
    env = SimEnvironment()
    s = make_scheduler(env, queue_timeout_s=1.0)
    req = make_request(env, 0, 1, 0, 10**9)
    s.push(req)
    env.run(until=1_000_000)
    assert not s.expired(req)  # exactly at the timeout: still waiting
    env.run(until=2_000_000)
    assert s.peek() is req and s.expired(req)


def test_requeue_wakes_the_engine() -> None:
    env = SimEnvironment()
    wake = Signal(env)
    s = RequestQueue(env, SchedulerConfig(), wake)
    woken: list[int] = []

    def engine() -> Generator[simpy.Event, object, None]:
        yield wake.wait()
        woken.append(int(env.now))

    env.process(engine())
    env.run(until=5)  # the engine waits
    waiting = wake.wait()
    s.requeue(make_request(env, 0, 1, 0, 10**9))
    assert waiting.triggered and len(s) == 1
    env.run()
    assert woken == [5]


def test_a_wake_up_nobody_waits_for_schedules_nothing() -> None:
    env = SimEnvironment()
    wake = Signal(env)
    s = RequestQueue(env, SchedulerConfig(), wake)
    waiting = wake.wait()
    s.requeue(make_request(env, 0, 1, 0, 10**9))
    assert not waiting.triggered and len(s) == 1
    assert env.peek() == float("inf")  # no event was scheduled


def test_a_listener_hears_the_wake_up_instead_of_the_waiters() -> None:
    env = SimEnvironment()
    wake = Signal(env)
    heard: list[int] = []
    wake.listen(lambda: heard.append(int(env.now)))
    wake.notify()
    wake.notify()
    assert heard == [0, 0] and env.peek() == float("inf")
    wake.listen(None)
    wake.notify()
    assert heard == [0, 0]
