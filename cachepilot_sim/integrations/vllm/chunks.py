"""Session-ranked eviction over vLLM's offloaded KV chunks, with no vLLM import.

vLLM 0.33's CPU offload manager keeps KV in fixed-size chunks keyed by block hash and asks its
CachePolicy for exactly n idle victims when a store needs room. Chunks are grouped into the session
that last used them; the session's idle gaps train the simulator's GapEstimator, and sessions are
ranked by a simulator ranking policy (one implementation, two adapters). Within a session the tail
goes first: vLLM loads only a run of consecutive hits from the head, so a lost head chunk would make
every later one useless. `SessionChunkPolicy` ranks by a full sort per decision (any ranking
policy); perc_chunks.PercChunkPolicy keeps PERC's key inputs in arrays instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachepilot_sim.clock import s_to_us
from cachepilot_sim.cost import compute_fit, recompute_us
from cachepilot_sim.integrations.vllm.params import PercParams, resolve_params
from cachepilot_sim.policies import CacheEntry, GapEstimator
from cachepilot_sim.policies.base import RankingPolicy
from cachepilot_sim.policies.perc import PercPolicy

Clock = Callable[[], int]
# session entry id -> its protected idle chunks (count, restore)
Held = dict[int, tuple[int, float]]


def monotonic_us() -> int:
    """Real time for the serving engine (the simulator never calls this)."""
    return time.monotonic_ns() // 1000


@dataclass(slots=True, eq=False)
class _Session:
    entry: CacheEntry  # the simulator's view; num_bytes/num_tokens/restore_us set per decision
    chunks: dict[Any, _Chunk] = field(default_factory=dict)  # insertion-ordered, never a set
    num_evictable: int = 0
    evictable_restore_us: float = 0.0
    num_active: int = 0
    last_finished_us: int = -1
    context_tokens: int = 0  # the largest chunk end this session stored or used
    # `chunks` is in ascending (end_token, seq) order, so its reverse is the eviction order.
    tail_ordered: bool = True
    slot: int = -1  # its slot in PercChunkPolicy's key-input arrays (-1: not there)


@dataclass(slots=True, eq=False)
class _Chunk:
    key: Any
    status: Any  # vLLM's ChunkStatus (ctypes struct with ref_cnt, chunk_id)
    session: _Session
    end_token: int
    restore_us: float
    seq: int
    evictable: bool = False


@dataclass(slots=True)
class _RequestState:
    """Stored on vLLM's ReqContext so a request's session is resolved once."""

    owner: object
    generation: int
    session: _Session


def session_key(req_context: Any, session_field: str) -> str:
    """The session a request belongs to: kv_transfer_params[field], else a kv hint payload's
    field, else the request id (every request its own session)."""
    params = getattr(req_context, "kv_transfer_params", None)
    if isinstance(params, dict) and params.get(session_field) is not None:
        return f"session:{params[session_field]}"
    hints = getattr(req_context, "kv_hints", None)
    for action in getattr(hints, "actions", None) or ():
        payload = getattr(action, "payload", None)
        if isinstance(payload, dict) and payload.get(session_field) is not None:
            return f"session:{payload[session_field]}"
    return f"request:{req_context.req_id}"


def session_class(req_context: Any, class_field: str) -> int:
    """The workload class index in kv_transfer_params[class_field], else -1 (unknown)."""
    params = getattr(req_context, "kv_transfer_params", None)
    value = params.get(class_field) if isinstance(params, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


class SessionChunkPolicy:
    """The CachePolicy methods of vLLM 0.33 (get, insert, remove, touch, evict, clear,
    mark_evictable, mark_non_evictable and the request hooks), sessions ranked by `self.ranking`.

    Chunk keys are opaque hashable values; chunk statuses need a `ref_cnt` (0 = idle).
    `clock` returns microseconds (monotonic real time by default; the benchmark injects its own).
    This class sorts every session with idle chunks at each decision; subclasses may keep them
    indexed (`_ranked`) and hook the ranking policy's callbacks (`_returned`, `_released`,
    `_evicted`).
    """

    # Sessions without chunks are kept for their gap history, up to this many.
    max_history_sessions = 65_536

    def __init__(
        self, cache_capacity: int, params: PercParams | None = None, clock: Clock | None = None
    ) -> None:
        self.cache_capacity = cache_capacity
        self.params = params if params is not None else resolve_params()
        self._clock = clock if clock is not None else monotonic_us
        pcfg = self.params.policy_config()
        self.estimator = GapEstimator(
            pcfg.ema_weight, float(s_to_us(pcfg.prior_gap_s)), float(s_to_us(pcfg.delta_s))
        )
        self.ranking = self._make_ranking()  # the simulator's class, unchanged
        self._fit = compute_fit(self.params.hardware())
        self._generation = 0
        self._reset()

    def _make_ranking(self) -> RankingPolicy:
        return PercPolicy(self.params.policy_config(), self.estimator)

    def _reset(self) -> None:
        self._chunks: dict[Any, _Chunk] = {}
        self._sessions: dict[str, _Session] = {}
        self._evictable_sessions: dict[int, _Session] = {}  # entry_id -> session, insertion order
        self._changed: dict[int, _Session] = {}  # sessions whose key inputs changed since a flush
        self._num_evictable = 0
        self._next_session_id = 0
        self._next_seq = 0

    # --- sessions and requests ---

    def _session(self, req_context: Any) -> _Session:
        state = req_context.get_state(_RequestState)
        if state is not None and state.owner is self and state.generation == self._generation:
            return state.session
        now = self._clock()
        key = session_key(req_context, self.params.session_field)
        session = self._sessions.pop(key, None)
        if session is None:
            sid = self._next_session_id
            cls = session_class(req_context, self.params.class_field)
            session = _Session(CacheEntry(sid, sid, 0, cls, 0, 0, 0, now, now))
            self._next_session_id += 1
        elif session.num_active == 0 and session.last_finished_us >= 0:
            # A session coming back: the gap since its last request finished trains lambda.
            self.estimator.observe(session.entry, now - session.last_finished_us)
            self._returned(session, now)
        self._sessions[key] = session  # most recently active last (history trimming order)
        session.num_active += 1
        self._used(session, now)
        req_context.set_state(_RequestState(self, self._generation, session))
        if len(self._sessions) > self.max_history_sessions:
            self._trim_history()
        return session

    def _used(self, session: _Session, now: int) -> None:
        session.entry.last_used_us = now
        self._changed[session.entry.entry_id] = session

    def _trim_history(self) -> None:
        """Forget the least recently active sessions without chunks, down to 3/4 of the cap at
        once, so that one scan serves many new sessions."""
        excess = len(self._sessions) - (3 * self.max_history_sessions) // 4
        idle = [k for k, s in self._sessions.items() if not s.chunks and s.num_active == 0]
        for key in idle[:excess]:
            del self._sessions[key]

    def _chunk_restore_us(self, end_token: int) -> float:
        """Recompute of the chunk's tokens on top of its cached prefix (attention included)."""
        start = max(end_token - self.params.tokens_per_chunk, 0)
        return recompute_us(self._fit, end_token) - recompute_us(self._fit, start)

    def _set_evictable(self, chunk: _Chunk, evictable: bool) -> None:
        if chunk.evictable == evictable:
            return
        chunk.evictable = evictable
        session = chunk.session
        sign = 1 if evictable else -1
        self._num_evictable += sign
        session.num_evictable += sign
        session.evictable_restore_us += sign * chunk.restore_us
        sid = session.entry.entry_id
        self._changed[sid] = session
        if session.num_evictable == 0:
            session.evictable_restore_us = 0.0  # no float drift carried over
            self._evictable_sessions.pop(sid, None)
        else:
            self._evictable_sessions.setdefault(sid, session)

    def _attach(self, chunk: _Chunk, session: _Session) -> None:
        chunks = session.chunks
        if chunks and session.tail_ordered:
            last = chunks[next(reversed(chunks))]
            session.tail_ordered = (last.end_token, last.seq) < (chunk.end_token, chunk.seq)
        chunk.session = session
        chunks[chunk.key] = chunk
        if chunk.end_token > session.context_tokens:
            session.context_tokens = chunk.end_token

    def _move(self, chunk: _Chunk, session: _Session) -> None:
        if chunk.session is session:
            return
        evictable = chunk.evictable
        self._set_evictable(chunk, False)
        del chunk.session.chunks[chunk.key]
        self._attach(chunk, session)
        self._set_evictable(chunk, evictable)

    def _detach(self, chunk: _Chunk) -> None:
        self._set_evictable(chunk, False)
        del chunk.session.chunks[chunk.key]
        del self._chunks[chunk.key]

    # --- vLLM CachePolicy interface ---

    def get(self, key: Any) -> Any:
        chunk = self._chunks.get(key)
        return None if chunk is None else chunk.status

    def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
        session = self._session(req_context)
        if key in self._chunks:
            self._detach(self._chunks[key])
        end = req_context.get_offload_key_position(key)
        if end is None:  # no position recorded: assume the session's context grows by one chunk
            end = self.params.tokens_per_chunk * (len(session.chunks) + 1)
        record = _Chunk(key, chunk, session, end, self._chunk_restore_us(end), self._next_seq)
        self._next_seq += 1
        self._chunks[key] = record
        self._attach(record, session)
        self._used(session, self._clock())
        if chunk.ref_cnt == 0:
            self._set_evictable(record, True)

    def remove(self, key: Any) -> None:
        self._detach(self._chunks[key])

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        session = self._session(req_context)
        chunks = self._chunks
        for key in keys:
            chunk = chunks.get(key)
            if chunk is not None:
                self._move(chunk, session)
        self._used(session, self._clock())

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        self._session(req_context)  # misses are not resident: only the request is registered

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        self.touch(keys, req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        for keys in key_groups:
            self.touch(keys, req_context)
        session = self._session(req_context)
        session.num_active = max(session.num_active - 1, 0)
        now = self._clock()
        session.last_finished_us = now
        self._used(session, now)
        if session.num_active == 0:
            self._released(session, now)

    def mark_evictable(self, key: Any) -> None:
        self._set_evictable(self._chunks[key], True)

    def mark_non_evictable(self, key: Any) -> None:
        self._set_evictable(self._chunks[key], False)

    def clear(self) -> None:
        self._generation += 1
        self._reset()

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        """Exactly n idle, unprotected chunks (tail first within a session, sessions in the
        ranking's order), or None with no state changed when fewer than n exist."""
        if n <= 0:
            return []
        if n > self._num_evictable:
            return None
        held, num_held = self._held(protected)
        if n > self._num_evictable - num_held:
            return None
        now = self._clock()
        out: list[tuple[Any, Any]] = []
        for session in self._ranked(now, held):
            self._evicted(session, now)
            mine = protected if session.entry.entry_id in held else None
            self._take_tail(session, n - len(out), mine, out)
            if len(out) == n:
                break
        return out

    def _held(self, protected: set[Any]) -> tuple[Held, int]:
        """Protected idle chunks per session (count, restore summed in `protected`'s order)."""
        held: Held = {}
        num_held, count, restore = 0, 0, 0.0
        get = self._chunks.get
        session: _Session | None = None
        for key in protected:
            chunk = get(key)
            if chunk is None or not chunk.evictable:
                continue
            if chunk.session is not session:  # runs of one session's keys are the common case
                if session is not None:
                    held[session.entry.entry_id] = (count, restore)
                session = chunk.session
                count, restore = held.get(session.entry.entry_id, (0, 0.0))
            count += 1
            restore += chunk.restore_us
            num_held += 1
        if session is not None:
            held[session.entry.entry_id] = (count, restore)
        return held, num_held

    def _take_tail(
        self, session: _Session, count: int, protected: set[Any] | None, out: list[tuple[Any, Any]]
    ) -> None:
        """Forgets up to `count` of the session's idle chunks outside `protected`, tail first,
        appending their (key, status) to `out` (`_detach` inlined: a decision's own cost)."""
        if not session.tail_ordered:  # a chunk joined out of order: sort once, then append again
            ordered = sorted(session.chunks.values(), key=lambda c: (c.end_token, c.seq))
            session.chunks = {c.key: c for c in ordered}
            session.tail_ordered = True
        taken: list[_Chunk] = []
        for chunk in reversed(session.chunks.values()):
            if chunk.evictable and (protected is None or chunk.key not in protected):
                taken.append(chunk)
                if len(taken) == count:
                    break
        mine, chunks = session.chunks, self._chunks
        restore = session.evictable_restore_us
        for chunk in taken:
            chunk.evictable = False
            restore -= chunk.restore_us  # one chunk at a time, as `_set_evictable` subtracts
            del mine[chunk.key]
            del chunks[chunk.key]
            out.append((chunk.key, chunk.status))
        session.num_evictable -= len(taken)
        self._num_evictable -= len(taken)
        sid = session.entry.entry_id
        self._changed[sid] = session
        if session.num_evictable == 0:
            restore = 0.0  # no float drift carried over
            self._evictable_sessions.pop(sid, None)
        session.evictable_restore_us = restore

    # --- ranking: a full sort here, an index in PercChunkPolicy ---

    def _ranked(self, now: int, held: Held) -> Iterator[_Session]:
        """Sessions with idle unprotected chunks, first victim first: each as a CacheEntry (bytes
        = tokens of those chunks, restore = their recompute) sorted by the ranking policy."""
        tpc = self.params.tokens_per_chunk
        entries: list[CacheEntry] = []
        for sid, session in self._evictable_sessions.items():
            count, restore = held.get(sid, (0, 0.0))
            if session.num_evictable > count:
                entry = session.entry
                entry.num_tokens = (session.num_evictable - count) * tpc
                entry.num_bytes = entry.num_tokens
                entry.restore_us = entry.recompute_us = session.evictable_restore_us - restore
                entries.append(entry)
        self._changed.clear()
        sessions = self._evictable_sessions
        ordered = [sessions[e.entry_id] for e in self.ranking.order(entries, now)]
        yield from ordered

    def _returned(self, session: _Session, now: int) -> None:
        """A session with no request in flight started one (after the gap was observed)."""

    def _released(self, session: _Session, now: int) -> None:
        """A session's last request in flight finished: its KV is idle from now."""

    def _evicted(self, session: _Session, now: int) -> None:
        """The decision takes chunks of this session (called before they are detached)."""
