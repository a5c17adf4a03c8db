"""Session inference for traces without session ids (Mooncake): a request that extends an earlier
request's full prefix-block list is that request's next turn.

Rule (the shared traces README's heuristic): request r continues an earlier request p when r's
`hash_ids` start with all of p's full blocks (input_length // block tokens, at least one), p
introduced at least one of those blocks itself (it was the first request to use it), and r's input
is longer than p's. The parent is the most recent such p; chains of parents are sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepilot_sim.workloads.traces import TraceTable


@dataclass(frozen=True, slots=True)
class Sessions:
    """parent[i] (-1: none), session[i] and turn[i] of every request, plus the session count."""

    parent: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    num_sessions: int

    @classmethod
    def singletons(cls, num_requests: int) -> Sessions:
        """Every request is its own one-turn session (traces without prefix information)."""
        ids = np.arange(num_requests, dtype=np.int64)
        return cls(
            np.full(num_requests, -1, dtype=np.int64),
            ids,
            np.zeros(num_requests, dtype=np.int64),
            num_requests,
        )


def _introduced_full(table: TraceTable, num_full: np.ndarray) -> np.ndarray:
    """Whether each request was the first to use at least one of its own full blocks."""
    assert table.hash_offsets is not None and table.hash_values is not None
    n = table.num_requests
    lengths = np.diff(table.hash_offsets)
    owner_of_pos = np.repeat(np.arange(n, dtype=np.int64), lengths)
    positions = np.arange(table.hash_values.size, dtype=np.int64)
    pos_in_req = positions - table.hash_offsets[owner_of_pos]
    _, first_pos, inverse = np.unique(table.hash_values, return_index=True, return_inverse=True)
    first_owner = owner_of_pos[first_pos][inverse]  # the request that introduced each position's id
    mine = (first_owner == owner_of_pos) & (pos_in_req < num_full[owner_of_pos])
    return np.bincount(owner_of_pos[mine], minlength=n) > 0


def infer_sessions(table: TraceTable, block_tokens: int) -> Sessions:
    """Parents, sessions and turn numbers by the continuation rule above (file order)."""
    n = table.num_requests
    if table.hash_offsets is None or table.hash_values is None:
        return Sessions.singletons(n)
    num_full = table.input_tokens // block_tokens
    introduced = _introduced_full(table, num_full)
    parent = np.full(n, -1, dtype=np.int64)
    # Prefix hashes identify the whole prefix, so "r starts with p's full blocks" is "r holds, at
    # position num_full[p] - 1, p's last full block": one dict lookup per block of r.
    latest_by_last_full: dict[int, int] = {}
    offsets, values = table.hash_offsets.tolist(), table.hash_values.tolist()
    inputs = table.input_tokens.tolist()
    for r in range(n):
        best = -1
        for h in values[offsets[r] : offsets[r + 1]]:
            p = latest_by_last_full.get(h, -1)
            if p > best and inputs[r] > inputs[p]:
                best = p
        parent[r] = best
        k = int(num_full[r])
        if k >= 1 and introduced[r]:
            latest_by_last_full[values[offsets[r] + k - 1]] = r
    session = np.empty(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    num_sessions = 0
    for r, p in enumerate(parent.tolist()):  # parents come first: one pass suffices
        if p < 0:
            session[r], num_sessions = num_sessions, num_sessions + 1
        else:
            session[r], turn[r] = session[p], turn[p] + 1
    return Sessions(parent, session, turn, num_sessions)
