"""TEST DOUBLE: a local re-statement of vLLM 0.33's KV-offload CachePolicy contract.

Not vLLM. It restates, from vllm/v1/kv_offload/cpu/policies/base.py and vllm/v1/kv_offload/base.py
of vLLM 0.33.0, the parts our policy touches: ChunkStatus (ref_cnt -1 = store pending, 0 = idle,
> 0 = being read), ReqContext (req_id, kv_transfer_params, kv_hints, per-request state, key
positions) and the abstract CachePolicy methods. Tests built on it run without the vLLM wheel; the
tests in tests/unit/test_vllm_real.py run the same policy through vLLM's own classes and skip when
vLLM is absent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cachepilot_sim.integrations.vllm.chunks import Clock
from cachepilot_sim.integrations.vllm.forecast_chunks import ForecastChunkPolicy
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy


class ChunkStatus:
    def __init__(self, chunk_id: int) -> None:
        self.ref_cnt = -1
        self.chunk_id = chunk_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass
class KvHintAction:
    action_id: str
    action_type: str
    action_version: str
    payload: dict[str, Any]


@dataclass
class KvHintsEnvelope:
    protocol_version: str
    message_id: str
    actions: list[KvHintAction]


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: KvHintsEnvelope | None = None
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False)
    _positions: dict[Any, int] = field(default_factory=dict, repr=False, init=False)

    def set_state(self, val: Any) -> None:
        self._state[type(val)] = val

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)

    def set_offload_key_position(self, key: Any, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key: Any) -> int | None:
        return self._positions.get(key)


class CachePolicy(ABC):
    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: Any) -> Any: ...

    @abstractmethod
    def insert(self, key: Any, chunk: Any, req_context: Any) -> None: ...

    @abstractmethod
    def remove(self, key: Any) -> None: ...

    @abstractmethod
    def touch(self, keys: Iterable[Any], req_context: Any) -> None: ...

    @abstractmethod
    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None: ...

    @abstractmethod
    def clear(self) -> None: ...


class DoublePercCachePolicy(PercChunkPolicy, CachePolicy):
    """Our policy on the restated base class, built as vLLM's factory builds it."""

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        PercChunkPolicy.__init__(self, cache_capacity, params, clock)


class DoubleForecastCachePolicy(ForecastChunkPolicy, CachePolicy):
    """reuse_forecast on the restated base class, built as vLLM's factory builds it."""

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        ForecastChunkPolicy.__init__(self, cache_capacity, params, clock)
