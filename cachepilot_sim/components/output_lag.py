"""When a step's outputs reach the client: at its end, or, in vLLM 0.26 under async scheduling, only
once the next step is launched (`EngineCore.step_with_batch_queue` launches step n+1 before it
takes step n's output), which for an eager step (no CUDA graph) lasts about as long as that step:
its host launch, or past the CUDA launch queue nearly its GPU time (docs/vllm.md).

The batcher hands each first token and each finish to `OutputLag`; off, they are stamped at once,
exactly as before; on, they wait for the batcher's next step: an eager one releases them at its
end, any other at once. Only the stamps wait (the request's first-token and finish times, their
trace events and its `done` event): its tokens, KV and slot are the step's as before. The same
loop composes step n+1 only after launching step n, so after an eager step (launched until near
its end) a request that arrived during it joins the next step (`last_eager`).
"""

from __future__ import annotations

from typing import Protocol

import simpy

from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.config import EngineConfig


class OutputEvents(Protocol):
    """The trace events a step's outputs emit (trace/events.py)."""

    def first_token(self, t_us: int, req: Request) -> None:
        """`req` produced its first output token at `t_us`."""
        ...

    def finish(self, t_us: int, req: Request, blocks: int) -> None:
        """`req` completed at `t_us`, releasing `blocks` KV blocks."""
        ...


class OutputLag:
    """A step's first tokens and finishes, released at its end or after the next eager step."""

    def __init__(self, env: simpy.Environment, events: OutputEvents, engine: EngineConfig) -> None:
        self.env, self.events, self.enabled = env, events, engine.output_after_next_launch
        self.out_us = engine.frontend_out_us  # the front end's way to the client
        self.graph_max = max(engine.graph_sizes, default=0)  # a larger decode step runs eagerly
        self.pending: list[tuple[Request, int]] = []  # (request, its blocks; -1: first token)
        self.pending_at_us = -1  # the end of the step that produced them
        self.held_first: set[Request] = set()  # first tokens produced, not yet stamped
        # The last step was eager: vLLM composed the next one after its launch, near its end, so
        # a request that arrived during it is not held out of the next step (batcher._hold_new).
        self.last_eager = False

    def first_token(self, req: Request) -> None:
        """`req` produced its first token at the step that ends now."""
        self.held_first.add(req)
        if not self.enabled:
            self._release([(req, -1)])
            return
        self._hold(req, -1)

    def finish(self, req: Request, blocks: int) -> None:
        """`req` completed at the step that ends now, holding `blocks` KV blocks."""
        req.outcome = Outcome.COMPLETED
        if not self.enabled:
            self._release([(req, blocks)])
            return
        self._hold(req, blocks)

    def next_step(self, duration_us: int, num_decode: int, chunks: list[int]) -> None:
        """The batcher starts a step of `duration_us` now (`num_decode` decodes, prefill `chunks`):
        an eager one (a chunk of more than one token, or more tokens than the largest CUDA graph:
        vLLM's `get_uniform_token_count` and capture sizes) right after the step that produced
        the held outputs releases them at its end; anything else releases them now."""
        eager = any(c > 1 for c in chunks) or num_decode + sum(chunks) > self.graph_max
        self.last_eager = self.enabled and eager
        if not self.pending:
            return
        if eager and self.pending_at_us == self.env.now and duration_us > 0:
            held, self.pending = self.pending, []
            self.env.timeout(duration_us).callbacks.append(lambda _: self._release(held))
            return
        self.release()

    def release(self) -> None:
        """Release what is held now (the engine goes idle, or the next step is a graph)."""
        if not self.pending:
            return
        held, self.pending = self.pending, []
        self._release(held)

    def _hold(self, req: Request, blocks: int) -> None:
        if self.pending_at_us != self.env.now:
            self.release()  # outputs of an earlier step were never followed by one: due now
        self.pending_at_us = int(self.env.now)
        self.pending.append((req, blocks))

    def _release(self, held: list[tuple[Request, int]]) -> None:
        """Stamp `held` now, or once the front end has carried them (`frontend_out_us`)."""
        if self.out_us:
            self.env.timeout(self.out_us).callbacks.append(lambda _: self._stamp(held))
            return
        self._stamp(held)

    def _stamp(self, held: list[tuple[Request, int]]) -> None:
        now = int(self.env.now)
        for req, blocks in held:
            if blocks < 0:
                req.first_token_us = now
                self.held_first.discard(req)
                self.events.first_token(now, req)
            else:
                self._release_finish(req, blocks)

    def _release_finish(self, req: Request, blocks: int) -> None:
        req.finish_us = int(self.env.now)
        self.events.finish(req.finish_us, req, blocks)
        req.done.succeed()
