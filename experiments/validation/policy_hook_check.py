#!/usr/bin/env python3
"""CPU check of the policy hook (policy_hook.py) on a tiny random model: run it, read the verdicts.

    PYTHONPATH=/work/tfsite:$PWD python experiments/validation/policy_hook_check.py [--json OUT]

Requests are sent in waves, each wave added while the engine thread is held at the top of a step
(so every run composes the same batches), the next wave once the last one finished. Checks:

1. `identity`: multi-turn sessions and fresh prompts through a small pool. The hook set to `mru`
   gives the engine's own run: the same block allocations (ids, in order), the same prefix hits per
   request, the same batches (request and query length per step) and the same generated tokens.
2. `lru_differs`: sessions A then B finish, a fresh prompt needs three cached blocks, then both
   come back (B first). `mru` reuses B's blocks (B's return misses them), `lru` A's.
3. `branching`: a shared system prompt. The engine's own order evicts blocks that cached blocks
   extend (counted as inner evictions; those blocks become unreachable); every hooked policy cuts
   only tails (0 inner evictions). So `mru` equals the engine only while no prefix branches.
Exit status 1 when a check fails; about 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

BLOCK = 32  # tokens per block of the tiny engine


@dataclass
class Send:
    """One request of a wave: its prompt (token ids) and reply length; a later turn names its
    parent and appends `new_tokens` fresh tokens to the parent's prompt and reply."""

    request_id: str
    new_tokens: int
    max_new_tokens: int = 3
    parent: str | None = None
    shared_prefix: int = 0  # leading tokens from the system prompt
    session: str | None = None


@dataclass
class Trace:
    """What one run did, step by step."""

    allocations: list[list[int]] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    batches: list[list[tuple[str, int]]] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


def build_engine(num_blocks: int) -> tuple[Any, Any]:
    from hf_engine import EngineSpec, make_engine
    from hf_instrument import Recorder
    from hf_model import build_model

    model = build_model(True)
    spec = EngineSpec(
        "policy_check",
        num_blocks=num_blocks,
        block_size=BLOCK,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        precapture_max_seqlen_k=0,
        safety_margin=0.0,
    )
    mgr, _ = make_engine(model, spec, Recorder(use_cuda=False), True)
    return mgr, spec


class Driver:
    """Runs waves on one engine; each run starts from an empty prefix cache."""

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr
        self.gate = threading.Lock()
        self.trace = Trace()
        bp = mgr.batch_processor
        orig_prepare = bp.prepare_next_batch

        def prepare_next_batch() -> bool:
            with self.gate:  # the client adds a whole wave between two steps
                return orig_prepare()

        bp.prepare_next_batch = prepare_next_batch
        sched, cache = bp.scheduler, bp.cache
        orig_schedule, orig_search = sched.schedule_batch, cache.search_prefix_match

        def schedule_batch(token_budget: int, cache_budget: int) -> Any:
            res = orig_schedule(token_budget, cache_budget)
            if res[0]:
                self.trace.batches.append([(f.state.request_id, f.query_length) for f in res[0]])
            return res

        def search_prefix_match(request_id: str, prompt_ids: list[int]) -> int:
            hit = orig_search(request_id, prompt_ids)
            self.trace.hits.setdefault(request_id, hit)
            return hit

        sched.schedule_batch = schedule_batch
        cache.search_prefix_match = search_prefix_match

    def run(self, policy: str, waves: list[list[Send]], groups: dict[str, str]) -> Trace:
        from capture_client import token_ids
        from hf_engine import clear_prefix_cache
        from policy_hook import PolicyHook

        mgr = self.mgr
        if mgr.is_running():
            mgr.stop(block=True, timeout=60, keep_for_next_session=True)
        clear_prefix_cache(mgr)
        hook = PolicyHook(policy, lambda rid: groups.get(rid, rid))
        hook.attach(mgr)
        self.trace = trace = Trace()
        bm = mgr.batch_processor.cache._block_manager
        orig_get = bm.get_free_blocks

        def get_free_blocks(n: int, last: int | None, shareable: bool, group: int) -> Any:
            got = orig_get(n, last, shareable, group)
            if got is not None:
                trace.allocations.append(list(got))
            return got

        bm.get_free_blocks = get_free_blocks
        system = token_ids(7, "system", 4 * BLOCK, True)
        prompts: dict[str, list[int]] = {}
        mgr.start()
        try:
            for wave in waves:
                with self.gate:
                    for s in wave:
                        fresh = token_ids(7, s.request_id, s.new_tokens, True)
                        if s.parent is not None:
                            ids = prompts[s.parent] + trace.tokens[s.parent] + fresh
                        else:
                            ids = system[: s.shared_prefix] + fresh[s.shared_prefix :]
                        prompts[s.request_id] = ids
                        mgr.add_request(
                            input_ids=ids, request_id=s.request_id, max_new_tokens=s.max_new_tokens
                        )
                self._wait({s.request_id for s in wave}, trace)
        finally:
            mgr.stop(block=True, timeout=60, keep_for_next_session=True)
        trace.stats = hook.stats()
        return trace

    def _wait(self, pending: set[str], trace: Trace) -> None:
        deadline = time.perf_counter() + 60
        while pending:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"requests {sorted(pending)} did not finish in 60 s")
            res = self.mgr.get_result(timeout=0.05)
            if res is not None and res.is_finished():
                if res.error is not None:
                    raise RuntimeError(f"{res.request_id}: {res.error}")
                trace.tokens[res.request_id] = list(res.generated_tokens)
                pending.discard(res.request_id)


def identity_waves() -> list[list[Send]]:
    """Three sessions of three turns, concurrent turns, and fresh prompts that need cached
    blocks: no prefix is shared across sessions, so no cached prefix branches."""
    waves = [
        [Send("a0", 3 * BLOCK + 5, session="a"), Send("b0", 2 * BLOCK + 9, session="b")],
        [Send("c0", 4 * BLOCK + 1, session="c"), Send("x0", 5 * BLOCK)],
        [Send("a1", BLOCK + 3, parent="a0"), Send("b1", 2 * BLOCK, parent="b0")],
        [Send("x1", 6 * BLOCK + 7), Send("c1", BLOCK, parent="c0")],
        [Send("a2", 2 * BLOCK, parent="a1"), Send("b2", BLOCK + 11, parent="b1")],
        [Send("x2", 7 * BLOCK), Send("c2", 3 * BLOCK, parent="c1")],
        [Send("a3", BLOCK, parent="a2"), Send("b3", BLOCK, parent="b2")],
    ]
    return waves


def lru_waves() -> list[list[Send]]:
    """A, then B, each 3 full blocks + a partial one, then a fresh prompt that needs 3 of their
    6 cached blocks (of 24); then B comes back, then A."""
    return [
        [Send("a0", 3 * BLOCK + 4, session="a")],
        [Send("b0", 3 * BLOCK + 4, session="b")],
        [Send("x0", 20 * BLOCK + 8)],
        [Send("b1", 4, parent="b0")],
        [Send("a1", 4, parent="a0")],
    ]


def branching_waves() -> list[list[Send]]:
    """Requests sharing a 4-block system prompt, finishing together, then fresh prompts."""
    return [
        [Send("s0", 6 * BLOCK + 3, shared_prefix=4 * BLOCK)],
        [
            Send("s1", 6 * BLOCK + 3, shared_prefix=4 * BLOCK),
            Send("s2", 6 * BLOCK + 3, shared_prefix=4 * BLOCK),
        ],
        [Send("x0", 16 * BLOCK + 8)],
        [Send("s3", 6 * BLOCK + 3, shared_prefix=4 * BLOCK)],
    ]


def groups_of(waves: list[list[Send]]) -> dict[str, str]:
    """Each request's session (a later turn: its first turn's), as the capture's client knows."""
    out: dict[str, str] = {}
    for wave in waves:
        for s in wave:
            out[s.request_id] = out[s.parent] if s.parent else (s.session or s.request_id)
    return out


def check_identity(d: Driver) -> dict[str, Any]:
    waves = identity_waves()
    engine = d.run("none", waves, groups_of(waves))
    mru = d.run("mru", waves, groups_of(waves))
    return {
        "same_allocations": engine.allocations == mru.allocations,
        "same_prefix_hits": engine.hits == mru.hits,
        "same_batches": engine.batches == mru.batches,
        "same_tokens": engine.tokens == mru.tokens,
        "evictions": [engine.stats["evictions"], mru.stats["evictions"]],
        "hit_tokens": sum(engine.hits.values()),
    }


def check_lru(d: Driver) -> dict[str, Any]:
    waves = lru_waves()
    mru = d.run("mru", waves, groups_of(waves))
    lru = d.run("lru", waves, groups_of(waves))
    return {
        "mru_hits": {k: mru.hits[k] for k in ("a1", "b1")},
        "lru_hits": {k: lru.hits[k] for k in ("a1", "b1")},
        "mru_reuses_b": mru.hits["a1"] > mru.hits["b1"],
        "lru_reuses_a": lru.hits["b1"] > lru.hits["a1"],
        "allocations_differ": mru.allocations != lru.allocations,
    }


def check_branching(d: Driver) -> dict[str, Any]:
    waves = branching_waves()
    out: dict[str, Any] = {}
    for policy in ("none", "mru", "lru", "lfu", "perc", "s3fifo"):
        t = d.run(policy, waves, groups_of(waves))
        out[policy] = {
            "inner_evictions": t.stats["inner_evictions"],
            "evictions": t.stats["evictions"],
            "s3_hit": t.hits["s3"],
        }
    return out


def verdicts(res: dict[str, Any]) -> list[str]:
    """The failed checks (empty when all pass)."""
    bad = []
    ident = res["identity"]
    for k in ("same_allocations", "same_prefix_hits", "same_batches", "same_tokens"):
        if not ident[k]:
            bad.append(f"identity: {k} is false")
    if min(ident["evictions"]) == 0:
        bad.append("identity: the workload evicted no cached block (it checks nothing)")
    lru = res["lru_differs"]
    for k in ("mru_reuses_b", "lru_reuses_a", "allocations_differ"):
        if not lru[k]:
            bad.append(f"lru_differs: {k} is false ({lru})")
    br = res["branching"]
    if br["none"]["inner_evictions"] == 0:
        bad.append("branching: the engine's own order evicted no inner block")
    for p, row in br.items():
        if p != "none" and row["inner_evictions"]:
            bad.append(f"branching: {p} evicted {row['inner_evictions']} inner blocks")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    mgr, _ = build_engine(num_blocks=24)
    d = Driver(mgr)
    res = {"identity": check_identity(d), "lru_differs": check_lru(d)}
    res["branching"] = check_branching(d)
    from hf_engine import destroy_engine

    destroy_engine(mgr)
    bad = verdicts(res)
    res["failed"] = bad
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    print("policy hook check: " + ("ok" if not bad else f"{len(bad)} failed"))
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
