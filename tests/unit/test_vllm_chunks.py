"""PERC as a vLLM cache policy, on the restated contract (tests/vllm_double.py, not vLLM)."""

from __future__ import annotations

import numpy as np

from cachepilot_sim.config import HardwareConfig, policy_config
from cachepilot_sim.cost import compute_fit, recompute_us
from cachepilot_sim.integrations.vllm.chunks import SessionChunkPolicy, _Session, session_key
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.perc_chunks import PercChunkPolicy, SessionArrays
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy, perc
from tests.vllm_double import (
    ChunkStatus,
    DoublePercCachePolicy,
    KvHintAction,
    KvHintsEnvelope,
    ReqContext,
)

S = 1_000_000
TPC = 16


class ManualClock:
    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> int:
        return self.now_us


def make_policy_under_test(**params: object) -> tuple[DoublePercCachePolicy, ManualClock]:
    clock = ManualClock()
    return DoublePercCachePolicy(100, PercParams(tokens_per_chunk=TPC, **params), clock), clock


def run_request(
    policy: DoublePercCachePolicy,
    session: str,
    chunks: range,
    req_id: str,
    first_token: int = 0,
) -> list[tuple[str, int]]:
    """One request that stores `chunks` of `session` (positions from first_token) and finishes."""
    ctx = ReqContext(req_id, kv_transfer_params={"session_id": session})
    keys = [(session, i) for i in chunks]
    for j, key in enumerate(keys):
        ctx.set_offload_key_position(key, first_token + (j + 1) * TPC)
        status = ChunkStatus(hash(key) & 0xFFFF)
        policy.insert(key, status, ctx)
        status.ref_cnt = 0  # the store completed
        policy.mark_evictable(key)
    policy.on_request_finished((tuple(keys),), set(keys), set(), ctx)
    return keys


def test_evict_takes_exactly_n_chunks_from_the_tail_and_forgets_them() -> None:
    policy, _ = make_policy_under_test()
    keys = run_request(policy, "a", range(5), "r0")
    evicted = policy.evict(2, set())
    assert evicted is not None
    assert [k for k, _ in evicted] == [keys[4], keys[3]]
    assert [policy.get(k) is None for k in keys] == [False, False, False, True, True]


def test_evict_returns_none_and_changes_nothing_when_too_few_chunks_are_evictable() -> None:
    policy, _ = make_policy_under_test()
    k0, k1, k2 = run_request(policy, "a", range(3), "r0")
    policy.get(k2).ref_cnt = 1  # a load in flight pins it
    policy.mark_non_evictable(k2)
    assert policy.evict(2, {k0}) is None
    assert all(policy.get(k) is not None for k in (k0, k1, k2))
    evicted = policy.evict(1, {k0})
    assert evicted is not None and [k for k, _ in evicted] == [k1]
    assert policy.evict(0, set()) == []


def test_session_that_comes_back_often_outlives_a_more_recent_slow_one() -> None:
    """LRU would evict `fast` (used longer ago); PERC evicts `slow`, whose learned gap is long."""
    policy, clock = make_policy_under_test(delta_s=30.0, prior_gap_s=20.0)
    for turn in range(4):  # `slow` returns every 300 s, `fast` every 10 s; fast is last used first
        clock.now_us = turn * 300 * S
        run_request(policy, "slow", range(turn * 2, turn * 2 + 2), f"s{turn}", turn * 2 * TPC)
    for turn in range(4):
        clock.now_us = 862 * S + turn * 10 * S
        run_request(policy, "fast", range(turn * 2, turn * 2 + 2), f"f{turn}", turn * 2 * TPC)
    clock.now_us = 900 * S
    run_request(policy, "slow", range(8, 8), "s-last")  # slow used at 900 s, fast at 892 s
    clock.now_us = 902 * S
    evicted = policy.evict(8, set())
    assert evicted is not None
    assert {k[0] for k, _ in evicted} == {"slow"}


def test_gap_of_a_returning_session_trains_the_estimator() -> None:
    policy, clock = make_policy_under_test(ema_weight=0.5, prior_gap_s=20.0)
    run_request(policy, "a", range(1), "r0")
    clock.now_us = 10 * S
    run_request(policy, "a", range(1, 2), "r1", TPC)
    assert policy.estimator.population_gap_us == 0.5 * 20 * S + 0.5 * 10 * S


def test_session_id_comes_from_transfer_params_then_hints_then_the_request() -> None:
    hint = KvHintsEnvelope("1", "m", [KvHintAction("a", "session", "1", {"session_id": 7})])
    assert session_key(ReqContext("r", {"session_id": "x"}, hint), "session_id") == "session:x"
    assert session_key(ReqContext("r", None, hint), "session_id") == "session:7"
    assert session_key(ReqContext("r", {"other": 1}), "session_id") == "request:r"


def test_deep_chunks_cost_more_to_restore_so_shallow_ones_go_first() -> None:
    policy, _ = make_policy_under_test()
    deep = run_request(policy, "deep", range(1), "r0", first_token=32_768)
    shallow = run_request(policy, "shallow", range(1), "r1")
    evicted = policy.evict(1, set())
    assert evicted is not None and [k for k, _ in evicted] == shallow
    assert policy.get(deep[0]) is not None


def test_session_order_is_the_simulators_perc_order() -> None:
    """40 one-chunk sessions (the vectorised path): evict order == PercPolicy.order."""
    rng = np.random.default_rng(3)
    params = PercParams(tokens_per_chunk=TPC)
    policy, clock = make_policy_under_test()
    fit = compute_fit(HardwareConfig())
    estimator = GapEstimator(params.ema_weight, 20 * S, 30 * S)
    entries: list[CacheEntry] = []
    for sid in range(40):
        gap_s, end, done = float(rng.uniform(1, 200)), int(rng.integers(1, 2000)) * TPC, sid * S
        clock.now_us = done
        run_request(policy, f"s{sid}", range(1), f"a{sid}", end - TPC)
        clock.now_us = done + int(gap_s * S)
        run_request(policy, f"s{sid}", range(1, 1), f"b{sid}")  # a return with nothing to store
        entry = CacheEntry(sid, sid, 0, 0, 0, TPC, TPC, 0, clock.now_us)
        entry.restore_us = recompute_us(fit, end) - recompute_us(fit, end - TPC)
        estimator.observe(entry, int(gap_s * S))
        entries.append(entry)
    clock.now_us += 60 * S
    perc = make_policy(policy_config("perc"), estimator)
    expected = [f"s{e.session_id}" for e in perc.order(entries, clock.now_us)]
    evicted = policy.evict(40, set())
    assert evicted is not None
    assert [k[0] for k, _ in evicted] == expected


def test_clear_forgets_every_chunk_and_request() -> None:
    policy, _ = make_policy_under_test()
    keys = run_request(policy, "a", range(3), "r0")
    policy.clear()
    assert all(policy.get(k) is None for k in keys)
    assert policy.evict(1, set()) is None
    policy.remove  # noqa: B018 (the contract method exists)
    run_request(policy, "a", range(1), "r1")
    evicted = policy.evict(1, set())
    assert evicted is not None and len(evicted) == 1


def test_history_of_sessions_without_chunks_is_bounded_oldest_first() -> None:
    policy, clock = make_policy_under_test(prior_gap_s=20.0, ema_weight=1.0)
    policy.max_history_sessions = 4  # past 4 sessions, trimmed to 3 at once (one scan per trim)
    run_request(policy, "kept", range(1), "k0")  # has a chunk: never trimmed
    for i in range(4):
        clock.now_us = (i + 1) * S
        run_request(policy, f"empty{i}", range(0), f"e{i}")
    # empty0 and empty1 were forgotten: coming back at 100 s observes no gap for them.
    before = policy.estimator.population_gap_us
    clock.now_us = 100 * S
    run_request(policy, "empty0", range(0), "again0")
    assert policy.estimator.population_gap_us == before
    run_request(policy, "empty3", range(0), "again3")  # still remembered: its gap is observed
    assert policy.estimator.population_gap_us == 96 * S
    assert policy.get(("kept", 0)) is not None


def test_a_session_is_ranked_by_its_unprotected_idle_chunks_only() -> None:
    """`a` costs more per byte than `b` over all its chunks, less without its protected deep one:
    the decision ranks it on what it may lose, as the full sort does."""
    policies = [
        make_policy_under_test()[0],
        SessionChunkPolicy(100, PercParams(tokens_per_chunk=TPC)),
    ]
    for policy in policies:
        policy._clock = lambda: 0
        shallow = run_request(policy, "a", range(1), "a0")
        deep = run_request(policy, "a", range(1, 2), "a1", first_token=65_536)
        medium = run_request(policy, "b", range(1), "b0", first_token=8_192)
        evicted = policy.evict(1, set(deep))
        assert evicted is not None and [k for k, _ in evicted] == shallow
        evicted = policy.evict(1, set())  # unprotected, a's deep chunk is the dearer one
        assert evicted is not None and [k for k, _ in evicted] == medium


def test_session_arrays_grow_and_refill_holes_without_losing_a_slot() -> None:
    arrays = SessionArrays(capacity=4)
    arrays.refresh_population(5.0)
    sessions = [_Session(CacheEntry(i, i, 0, 0, 0, 0, 0, 0, 100 + i)) for i in range(150)]
    for s in sessions:  # past the capacity several times
        s.entry.gap_ema_us = float(s.entry.entry_id % 2 * 1000 - 1)  # odd ids: an EMA of their own
        arrays.put(s, float(s.entry.entry_id), 16.0)
    for sid in range(0, 150, 3):  # holes filled from the end
        arrays.drop(sessions[sid])
    arrays.drop(sessions[0])  # absent: no-op
    arrays.put(sessions[1], 7.0, 32.0)  # an update keeps its slot
    for sid in (4, 8, 10):  # learn a gap: out of the prefix of sessions without one
        sessions[sid].entry.gap_ema_us = 0.5
        arrays.put(sessions[sid], float(sid), 16.0)
    arrays.drop(sessions[16])  # a hole in the prefix
    arrays.refresh_population(0.5)  # the base of sessions without an EMA of their own: max(., 1)
    last_used, base, cost, size, ids = (v[: arrays.num_slots] for v in arrays.views)
    kept = [i for i in range(150) if i % 3 and i != 16]
    assert all(sessions[i].slot == -1 for i in range(0, 150, 3))
    assert arrays.num_slots == len(kept) and sorted(ids.tolist()) == kept
    without_gap = [i for i in kept if i % 2 == 0 and i not in (4, 8, 10)]
    assert sorted(ids[: arrays.num_without_gap].tolist()) == without_gap
    for slot, sid in enumerate(ids.tolist()):
        assert arrays.of[slot] is sessions[sid] and sessions[sid].slot == slot
        assert last_used[slot] == 100 + sid
        assert (cost[slot], size[slot]) == ((7.0, 32.0) if sid == 1 else (float(sid), 16.0))
        assert base[slot] == (999.0 if sid % 2 else 1.0)
    assert set(arrays.views[2][arrays.num_slots :].tolist()) == {np.inf}  # restore past the last


def test_both_key_paths_are_the_keys_of_the_simulators_perc_score() -> None:
    """SessionArrays' Python keys equal PercPolicy.score and its NumPy negated keys the
    vectorised score PercPolicy.order uses from 32 entries on, bit for bit. The two sides differ
    where NumPy's expm1 and math's do (NumPy 2.4.6: 0.7 % of arguments, one unit in the last
    place), which is why each policy switches paths at the same count."""
    params = PercParams(tokens_per_chunk=TPC)
    estimator = GapEstimator(0.5, 7.0 * S, 30.0 * S)
    ranking = make_policy(params.policy_config(), estimator)
    rng = np.random.default_rng(3)
    arrays = SessionArrays(capacity=8)
    arrays.refresh_population(estimator.population_gap_us)
    entries = []
    for i in range(40):
        entry = CacheEntry(i, i, 0, 0, 0, 0, 0, 0, int(rng.integers(0, 90 * S)))
        entry.gap_ema_us = -1.0 if i % 4 == 0 else float(rng.uniform(0.0, 60.0 * S))
        entry.num_tokens = entry.num_bytes = int(rng.integers(1, 40)) * TPC
        entry.restore_us = entry.recompute_us = float(rng.uniform(1e3, 1e6))
        arrays.put(_Session(entry), entry.restore_us, float(entry.num_bytes))
        entries.append(entry)
    now = 100 * S
    expected = [ranking.score(entries[sid], now) for sid in arrays.views[4][:40].tolist()]
    keys = arrays.keys(now, estimator.delta_us)
    assert [k for k, _, _ in keys] == expected and [s for _, _, s in keys] == list(range(40))
    neg, ids = arrays.negated_keys(now, estimator.delta_us)  # over 64 slots, 24 of them unused
    in_slots = [entries[sid] for sid in arrays.views[4][:40].tolist()]
    gap = np.array([e.gap_ema_us for e in in_slots])
    idle = np.array([float(now - e.last_used_us) for e in in_slots])
    restore = np.array([e.restore_us for e in in_slots])
    size = np.array([float(max(e.num_bytes, 1)) for e in in_slots])
    vectorised = estimator.resume_probabilities(gap, idle) * restore / size  # PercPolicy.order's
    assert (-neg[:40]).tolist() == vectorised.tolist()
    assert ids[:40].tolist() == arrays.views[4][:40].tolist()
    assert neg.shape == (64,) and (neg[40:] == -np.inf).all()


def test_equal_keys_go_by_session_id_whatever_the_slot_order() -> None:
    """Four sessions with equal keys: session 0 goes first, its slot is refilled by session 3,
    and still 1, 2, 3 follow, on both key paths (the NumPy side takes maxima by slot)."""
    for vectorise_from in (0, 32):
        policy, _ = make_policy_under_test()
        policy.vectorise_from = vectorise_from
        keys = [run_request(policy, s, range(1), f"r{s}")[0] for s in "abcd"]
        order = [policy.evict(1, set()) for _ in range(4)]
        assert [e[0][0] for e in order if e] == keys, vectorise_from


def test_key_paths_switch_where_the_simulators_perc_order_switches() -> None:
    """Below the switch both compute keys with math.expm1, from it on with np.expm1: the same
    arithmetic as the reference on hosts where the two differ in the last place."""
    assert PercChunkPolicy.vectorise_from == perc._VECTORISE_FROM
