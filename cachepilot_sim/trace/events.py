"""One typed helper per trace event kind, so a component says what happened, not which of the
schema's 14 columns holds it. Each helper writes exactly one row through the recorder (which may
sample or drop it); the column meaning of every kind is documented in `trace/schema.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachepilot_sim.trace.recorder import NAN, TraceRecorder
from cachepilot_sim.trace.schema import REJECT_REASONS

if TYPE_CHECKING:  # plain data read by attribute; the trace package imports no component
    from cachepilot_sim.components.request import Request
    from cachepilot_sim.policies import CacheEntry


class TraceEvents:
    """The simulator's event vocabulary over one recorder; `t_us` is the current simulated time."""

    __slots__ = ("recorder",)

    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder

    # -- clients and scheduler ----------------------------------------------------------------
    def session_start(
        self,
        t_us: int,
        session: int,
        first_request: int,
        model: int,
        waited_us: int,
        class_index: int,
    ) -> None:
        """A new session got a front-end slot after waiting `waited_us`."""
        self.recorder.emit(
            t_us,
            "client",
            "session_start",
            session,
            first_request,
            model,
            value=waited_us,
            class_index=class_index,
        )

    def arrive(self, t_us: int, req: Request) -> None:
        """A request reached the scheduler; value = tokens it brings (context + prompt)."""
        self.recorder.emit(
            t_us,
            "scheduler",
            "arrive",
            req.session_id,
            req.req_id,
            req.model_index,
            value=req.context_tokens + req.prompt_tokens,
            class_index=req.class_index,
        )

    # -- batcher ------------------------------------------------------------------------------
    def admit(self, t_us: int, req: Request, blocks: int) -> None:
        self.recorder.emit(
            t_us,
            "batcher",
            "admit",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            value=req.prefill_tokens,
        )

    def reject(self, t_us: int, req: Request, reason: str) -> None:
        self.recorder.emit(
            t_us,
            "batcher",
            "reject",
            req.session_id,
            req.req_id,
            req.model_index,
            value=REJECT_REASONS.index(reason),
        )

    def first_token(self, t_us: int, req: Request) -> None:
        self.recorder.emit(
            t_us,
            "batcher",
            "first_token",
            req.session_id,
            req.req_id,
            req.model_index,
            value=t_us - req.arrival_us,
        )

    def finish(self, t_us: int, req: Request, blocks: int) -> None:
        self.recorder.emit(
            t_us,
            "batcher",
            "finish",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            value=req.generated,
        )

    def iteration(self, t_us: int, num_seqs: int, held_bytes: int, duration_us: int) -> None:
        """A sampled engine iteration: sequences in the batch, KV bytes used + in flight."""
        self.recorder.emit(
            t_us, "batcher", "iteration", -1, -1, 0, num_seqs, held_bytes, "gpu", value=duration_us
        )

    # -- KV cache -----------------------------------------------------------------------------
    def reuse_gap(self, t_us: int, req: Request, gap_us: int, predicted_us: float) -> None:
        """A session came back after `gap_us`; the estimator had predicted `predicted_us`."""
        self.recorder.emit(
            t_us,
            "kv",
            "reuse_gap",
            req.session_id,
            req.req_id,
            req.model_index,
            value=gap_us,
            score=predicted_us,
        )

    def hit(self, t_us: int, req: Request, blocks: int = 0) -> None:
        self.recorder.emit(t_us, "kv", "hit", req.session_id, req.req_id, req.model_index, blocks)

    def recompute(self, t_us: int, req: Request, cost_us: float, blocks: int = 0) -> None:
        """Earlier context dropped: prefilled again at `cost_us` (value holds it rounded down)."""
        self.recorder.emit(
            t_us,
            "kv",
            "recompute",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            value=int(cost_us),
            cost_us=cost_us,
        )

    def evict(
        self,
        t_us: int,
        entry: CacheEntry,
        blocks: int,
        num_bytes: int,
        offload: bool,
        score: float,
        expected_us: float = NAN,
    ) -> None:
        """A victim chosen by the policy: sent to the CPU store (offload) or discarded."""
        kind, tier = ("evict_offload", "flight") if offload else ("evict_drop", "none")
        self.recorder.emit(
            t_us,
            "kv",
            kind,
            entry.session_id,
            -1,
            entry.model_index,
            blocks,
            num_bytes,
            tier,
            score,
            cost_us=expected_us,
        )

    def cpu_drop(self, t_us: int, entry: CacheEntry, blocks: int, num_bytes: int) -> None:
        """The CPU store discarded KV to make room (counted as `cpu_drops`)."""
        self.recorder.emit(
            t_us,
            "kv",
            "evict_drop",
            entry.session_id,
            -1,
            entry.model_index,
            blocks,
            num_bytes,
            "cpu",
        )

    def preempt(self, t_us: int, req: Request, blocks: int, num_bytes: int, cost_us: float) -> None:
        self.recorder.emit(
            t_us,
            "kv",
            "preempt",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            num_bytes,
            "none",
            value=int(cost_us),
            cost_us=cost_us,
        )

    # -- PCIe copies --------------------------------------------------------------------------
    def offload_done(
        self, t_us: int, entry: CacheEntry, blocks: int, wire_bytes: int, duration_us: int
    ) -> None:
        self.recorder.emit(
            t_us,
            "pcie",
            "offload_done",
            entry.session_id,
            -1,
            entry.model_index,
            blocks,
            wire_bytes,
            "cpu",
            value=duration_us,
        )

    def reload_start(self, t_us: int, req: Request, blocks: int, num_bytes: int) -> None:
        self.recorder.emit(
            t_us,
            "pcie",
            "reload_start",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            num_bytes,
            "flight",
        )

    def reload_done(
        self, t_us: int, req: Request, blocks: int, wire_bytes: int, duration_us: int
    ) -> None:
        self.recorder.emit(
            t_us,
            "pcie",
            "reload_done",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            wire_bytes,
            "gpu",
            value=duration_us,
        )

    def swap_out(
        self, t_us: int, req: Request, blocks: int, num_bytes: int, duration_us: int
    ) -> None:
        """A preempted request's KV copied to the engine's CPU swap space (not recomputed)."""
        self.recorder.emit(
            t_us,
            "pcie",
            "swap_out",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            num_bytes,
            "cpu",
            value=duration_us,
        )

    def swap_in(
        self, t_us: int, req: Request, blocks: int, num_bytes: int, duration_us: int
    ) -> None:
        """A swapped-out request's KV copied back as it resumes."""
        self.recorder.emit(
            t_us,
            "pcie",
            "swap_in",
            req.session_id,
            req.req_id,
            req.model_index,
            blocks,
            num_bytes,
            "gpu",
            value=duration_us,
        )

    # -- run ----------------------------------------------------------------------------------
    def run_end(self, t_us: int) -> None:
        """The last row of a complete run: t_us is the simulated duration."""
        self.recorder.emit(t_us, "sim", "run_end")
