"""vLLM 0.26's serving timeline in the engine loop (components/output_lag.py, the scheduler's
intake): a step's outputs wait for the next step's eager launch, after an eager step a request
that arrived during it joins the next step, and the AsyncLLM front end's two paths; all off by
default, so every other profile stamps outputs at its step's end as before."""

from __future__ import annotations

from typing import Any

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.output_lag import OutputLag
from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.components.scheduler import RequestQueue, Scheduler
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.config import EngineConfig, SchedulerConfig


class Recorder:
    """The trace events an output emits, as (kind, time, request id)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    def first_token(self, t_us: int, req: Request) -> None:
        self.seen.append(("first", t_us, req.req_id))

    def finish(self, t_us: int, req: Request, blocks: int) -> None:
        self.seen.append(("finish", t_us, req.req_id))

    def arrive(self, t_us: int, req: Request) -> None:
        self.seen.append(("arrive", t_us, req.req_id))


def request(env: SimEnvironment, rid: int, prompt: int = 10) -> Request:
    return Request(env, rid, rid, 0, 0, 0, 1, 0, 10**9, 1, 0, prompt, 10)


def lag(env: SimEnvironment, **engine: Any) -> tuple[OutputLag, Recorder]:
    rec = Recorder()
    cfg = EngineConfig(graph_sizes=[1, 2, 4, 8], **engine)
    return OutputLag(env, rec, cfg), rec


def at(env: SimEnvironment, t_us: int, action: Any) -> None:
    def proc() -> Any:
        yield env.timeout(t_us - env.now)
        action()

    env.process(proc())


def test_off_every_output_is_stamped_at_its_step_end() -> None:
    env = SimEnvironment()
    out, rec = lag(env)
    a, b = request(env, 0), request(env, 1)
    at(env, 10, lambda: (out.first_token(a), out.finish(b, 3), out.next_step(30, 0, [500])))
    env.run()
    assert rec.seen == [("first", 10, 0), ("finish", 10, 1)]
    assert a.first_token_us == 10 and b.finish_us == 10 and b.done.triggered
    assert b.outcome == Outcome.COMPLETED and not out.last_eager


def test_outputs_wait_for_the_next_eager_step_and_not_for_a_graph() -> None:
    env = SimEnvironment()
    out, rec = lag(env, output_after_next_launch=True)
    a, b, c = request(env, 0), request(env, 1), request(env, 2)

    def engine() -> Any:  # as the batcher: outputs of a step, then the next step is started
        yield env.timeout(10)
        out.first_token(a)
        out.next_step(30, 2, [500])  # eager: a's token leaves at its end, 40
        yield env.timeout(30)
        out.first_token(b)
        out.next_step(7, 3, [])  # a graph: b's token leaves at once
        yield env.timeout(7)
        out.finish(c, 2)
        out.next_step(7, 9, [])  # 9 decodes, more than the largest graph (8): eager
        yield env.timeout(7)

    env.process(engine())
    env.run()
    assert rec.seen == [("first", 40, 0), ("first", 40, 1), ("finish", 54, 2)]
    assert a.first_token_us == 40 and c.finish_us == 54 and c.done.triggered


def test_held_outputs_leave_when_the_engine_goes_idle() -> None:
    env = SimEnvironment()
    out, rec = lag(env, output_after_next_launch=True)
    a = request(env, 0)
    at(env, 10, lambda: (out.finish(a, 1), out.release()))
    env.run()
    assert rec.seen == [("finish", 10, 0)] and a.done.triggered


def test_after_an_eager_step_arrivals_are_not_held_out_of_the_next() -> None:
    env = SimEnvironment()
    out, _ = lag(env, output_after_next_launch=True)
    out.next_step(30, 1, [200])
    assert out.last_eager
    out.next_step(7, 4, [])
    assert not out.last_eager


def test_the_front_end_carries_outputs_to_the_client_later() -> None:
    env = SimEnvironment()
    out, rec = lag(env, frontend_out_us=5)
    a = request(env, 0)
    at(env, 10, lambda: out.first_token(a))
    env.run()
    assert rec.seen == [("first", 15, 0)] and a.first_token_us == 15


def test_the_front_end_takes_a_request_to_the_queue_by_its_prompt_length() -> None:
    env = SimEnvironment()
    rec = Recorder()
    queue = RequestQueue(env, SchedulerConfig(), Signal(env))

    class Arrivals:
        def on_arrival(self, req: Request) -> None:
            rec.seen.append(("listener", int(env.now), req.req_id))

    sched = Scheduler(env, queue, Arrivals(), rec, intake_us=(1000.0, 0.5))  # type: ignore[arg-type]
    sched.put(request(env, 7, prompt=1001))
    assert rec.seen == []  # not queued yet: the front end holds it
    env.run()
    assert rec.seen == [("arrive", 1501, 7), ("listener", 1501, 7)]  # ceil(1000 + 500.5)
    assert queue.peek() is not None and queue.peek().req_id == 7
