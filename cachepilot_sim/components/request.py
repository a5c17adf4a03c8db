"""One turn of a session as it moves through the server, and how it ended."""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol

from cachepilot_sim.clock import SimEnvironment


class Outcome(IntEnum):
    """How a request ended (PENDING until it completes or is rejected)."""

    PENDING = 0
    COMPLETED = 1
    REJECTED = 2


class KvSource(IntEnum):
    """Where the request's earlier context came from when it was admitted."""

    NEW = 0  # first turn: no earlier context
    HIT = 1  # on the GPU
    RELOAD = 2  # from the CPU store over PCIe
    RECOMPUTE = 3  # dropped earlier: prefilled again


class Request:
    """A turn: `context_tokens` of earlier turns (cacheable) + `prompt_tokens` new +
    `output_tokens`.
    """

    __slots__ = (
        "req_id",
        "session_id",
        "turn",
        "class_index",
        "model_index",
        "priority",
        "arrival_us",
        "deadline_us",
        "tpot_slo_us",
        "context_tokens",
        "prompt_tokens",
        "output_tokens",
        "admitted_us",
        "first_token_us",
        "finish_us",
        "generated",
        "outcome",
        "reject_reason",
        "kv_source",
        "reload_us_paid",
        "recompute_us_paid",
        "num_preemptions",
        "num_cpu_swaps",
        "done",
        "prefill_tokens",
        "prefix_hit_tokens",
        "session_wait_us",
        "next_gap_us",
        "hash_ids",
        "group_id",
        "parent",
    )

    def __init__(
        self,
        env: SimEnvironment,
        req_id: int,
        session_id: int,
        turn: int,
        class_index: int,
        model_index: int,
        priority: int,
        arrival_us: int,
        deadline_us: int,
        tpot_slo_us: int,
        context_tokens: int,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        self.req_id = req_id
        self.session_id = session_id
        self.turn = turn
        self.class_index = class_index
        self.model_index = model_index
        self.priority = priority
        self.arrival_us = arrival_us
        self.deadline_us = deadline_us
        self.tpot_slo_us = tpot_slo_us
        self.context_tokens = context_tokens
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.admitted_us = -1
        self.first_token_us = -1
        self.finish_us = -1
        self.generated = 0
        self.outcome = Outcome.PENDING
        self.reject_reason = ""
        self.kv_source = KvSource.NEW
        self.reload_us_paid = 0
        self.recompute_us_paid = 0.0
        self.num_preemptions = 0  # soft resets (recompute) and CPU swaps together
        self.num_cpu_swaps = 0  # the preemptions whose KV went to the engine's CPU swap space
        self.prefill_tokens = 0  # tokens this admission must prefill (set by the KV manager)
        self.prefix_hit_tokens = 0  # prompt tokens its first admission found cached (prefix KV)
        self.session_wait_us = 0  # first turn only: time the session waited for a front-end slot
        # The think time after this turn, known to the client only (-1: last turn). The KV manager
        # passes it on solely for clairvoyant policies (an upper bound on what prediction can buy).
        self.next_gap_us = -1
        # Trace replay: the prompt's prefix-block hashes, the inferred session (group) and the
        # earlier request this one continues (None: none). What the prefix KV manager reads.
        self.hash_ids: list[int] = []
        self.group_id = session_id
        self.parent: Request | None = None
        self.done = env.event()

    @property
    def total_tokens(self) -> int:
        """Tokens of KV this turn holds when it finishes."""
        return self.context_tokens + self.prompt_tokens + self.output_tokens


class RequestSink(Protocol):
    """Where clients put requests: one engine's scheduler, or a cluster's router. A put takes
    effect at once, at the current instant (no event of its own)."""

    def put(self, req: Request) -> None:
        """Hand `req` over now."""
