"""PERC and reuse_forecast behind vLLM 0.26's KV-offload CachePolicy contract (no vLLM import).

Our chunk policies (chunks.py) are written to 0.33's contract. vLLM 0.26 differs (docs/vllm.md,
"CPU offloading in vLLM 0.26"): `insert(key, block)` takes no request context, its `ReqContext`
is `(req_id, kv_transfer_params)` with no per-request state, key positions or kv hints, and the
policy hears of no request's end (the manager's `on_request_finished` does not reach it).
`Policy026` wraps a 0.33-style policy: the manager subclass (spec026.py) hands it the context of
each `prepare_store` (`storing`) for the inserts that follow, and each finished request
(`request_finished`); `Context026` gives a 0.26 context the state and position methods our
policies call (no position: a chunk's end token is then the session's chunk count times the
chunk size, chunks.py's fallback).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class Context026:
    """A 0.26 ReqContext seen through 0.33's: same request id and transfer params, no hints,
    per-request state kept by the adapter (one per request id), no key positions."""

    kv_hints = None

    def __init__(self, req_context: Any, states: dict[type, Any]) -> None:
        self.req_id = req_context.req_id
        self.kv_transfer_params = getattr(req_context, "kv_transfer_params", None)
        self._states = states

    def get_state(self, cls: type) -> Any:
        return self._states.get(cls)

    def set_state(self, value: Any) -> None:
        self._states[type(value)] = value

    def get_offload_key_position(self, key: Any) -> int | None:
        return None


class Policy026:
    """vLLM 0.26's CachePolicy methods over a 0.33-style chunk policy (`inner`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._states: dict[str, dict[type, Any]] = {}  # per request id, until it finishes
        self._storing: Context026 | None = None

    def _context(self, req_context: Any) -> Context026:
        states = self._states.setdefault(req_context.req_id, {})
        return Context026(req_context, states)

    @contextmanager
    def storing(self, req_context: Any) -> Iterator[None]:
        """The inserts inside this block belong to `req_context`'s request (prepare_store)."""
        self._storing = self._context(req_context)
        try:
            yield
        finally:
            self._storing = None

    def request_finished(self, req_context: Any) -> None:
        """The manager's on_request_finished: the session's request ended now."""
        if req_context.req_id not in self._states:
            return  # never stored nor touched anything: the policy never saw it
        self.inner.on_request_finished([], set(), set(), self._context(req_context))
        self._states.pop(req_context.req_id, None)

    # --- vLLM 0.26 CachePolicy ---

    def get(self, key: Any) -> Any:
        return self.inner.get(key)

    def insert(self, key: Any, block: Any) -> None:
        if self._storing is None:
            raise RuntimeError("Policy026.insert outside prepare_store: no request to charge")
        self.inner.insert(key, block, self._storing)

    def remove(self, key: Any) -> None:
        self.inner.remove(key)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        self.inner.touch(keys, self._context(req_context))

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        return self.inner.evict(n, protected)

    def clear(self) -> None:
        self.inner.clear()
        self._states.clear()

    def mark_evictable(self, key: Any) -> None:
        self.inner.mark_evictable(key)

    def mark_non_evictable(self, key: Any) -> None:
        self.inner.mark_non_evictable(key)
