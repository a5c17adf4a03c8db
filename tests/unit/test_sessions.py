"""Session inference: a request extending an earlier request's full block list is its next turn."""

from __future__ import annotations

import numpy as np

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.sessions import infer_sessions
from cachepilot_sim.workloads.traces import TraceTable, read_trace
from tests.conftest import SAMPLES_DIR

B = 512


def make_table(rows: list[tuple[int, list[int]]]) -> TraceTable:
    """(input tokens, hash ids) per request, one second apart."""
    n = len(rows)
    lengths = np.array([len(ids) for _, ids in rows], dtype=np.int64)
    return TraceTable(
        "mem",
        np.arange(1, n + 1),
        np.arange(n, dtype=np.int64) * 1_000_000,
        np.array([t for t, _ in rows], dtype=np.int64),
        np.ones(n, dtype=np.int64),
        np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        np.array([h for _, ids in rows for h in ids], dtype=np.int64),
    )


def test_continuations_chain_into_one_session_with_turn_numbers() -> None:
    t = make_table(
        [
            (1100, [1, 2, 3]),  # full blocks [1, 2]
            (1600, [1, 2, 4, 5]),  # starts with [1, 2], longer: turn 1; introduces full block 4
            (2100, [1, 2, 4, 6, 7]),  # extends request 1 ([1, 2, 4]) and request 0: latest wins
            (900, [8, 9]),  # unrelated: a new session
            (1100, [1, 2, 10]),  # starts with request 0's blocks but is not longer: no parent
        ]
    )
    s = infer_sessions(t, B)
    assert s.parent.tolist() == [-1, 0, 1, -1, -1]
    assert s.session.tolist() == [0, 0, 0, 1, 2]
    assert s.turn.tolist() == [0, 1, 2, 0, 0]
    assert s.num_sessions == 3


def test_a_request_that_introduced_none_of_its_full_blocks_is_nobodys_parent() -> None:
    t = make_table(
        [
            (1100, [1, 2, 3]),
            (1050, [1, 2, 11]),  # its full blocks [1, 2] came from request 0
            (1600, [1, 2, 12, 13]),  # extends both; only request 0 introduced them
        ]
    )
    assert infer_sessions(t, B).parent.tolist() == [-1, -1, 0]


def brute_force_parents(t: TraceTable) -> list[int]:
    """The rule written out directly, O(n^2): an independent check of the indexed version."""
    ids = [t.hash_ids(i).tolist() for i in range(t.num_requests)]
    first_user: dict[int, int] = {}
    for i, row in enumerate(ids):
        for h in row:
            first_user.setdefault(h, i)
    parents = []
    for r, row in enumerate(ids):
        best = -1
        for p in range(r):
            k = int(t.input_tokens[p]) // B
            full = ids[p][:k]
            if (
                k >= 1
                and row[:k] == full
                and any(first_user[h] == p for h in full)
                and t.input_tokens[r] > t.input_tokens[p]
            ):
                best = p
        parents.append(best)
    return parents


def test_inference_on_the_mooncake_sample_matches_the_rule_written_out() -> None:
    t = read_trace(
        TraceFormat.MOONCAKE,
        SAMPLES_DIR / "mooncake_synthetic" / "synthetic_trace.jsonl",
        OnError.RAISE,
    )
    s = infer_sessions(t, B)
    expected = brute_force_parents(t)
    assert s.parent.tolist() == expected
    assert sum(p >= 0 for p in expected) > 10  # the sample does contain continuations
