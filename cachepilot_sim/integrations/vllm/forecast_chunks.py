"""reuse_forecast over vLLM's offloaded KV chunks, with no vLLM import: the logic behind
ReuseForecastCachePolicy.

The simulator's ReuseForecastPolicy (policies/reuse_forecast.py, unchanged, same survival table)
ranks the sessions; this adapter feeds its hooks the way the simulator's session KV manager does:
`on_access` when an idle session sends its next request (the gap just ended), `on_release` when its
last request in flight finishes (features read: class from kv_transfer_params, context tokens,
earlier gaps, recent release rate), `on_evict` once per session that loses chunks in a decision
(the learned delta follows the idle age of evicted sessions). The key reads the curve, the idle
time and the learned delta, which changes at every eviction, so each decision sorts the sessions.
"""

from __future__ import annotations

from cachepilot_sim.config import policy_config
from cachepilot_sim.integrations.vllm.chunks import SessionChunkPolicy, _Session
from cachepilot_sim.policies import make_policy
from cachepilot_sim.policies.base import RankingPolicy


class ForecastChunkPolicy(SessionChunkPolicy):
    """SessionChunkPolicy ranked by the simulator's reuse_forecast policy (`params.forecast_model`
    picks the table; delta is learned from eviction ages, seeded with `params.delta_s`)."""

    def _make_ranking(self) -> RankingPolicy:
        p = self.params
        cfg = policy_config(
            "reuse_forecast",
            delta_s=float(p.delta_s),
            ema_weight=float(p.ema_weight),
            prior_gap_s=float(p.prior_gap_s),
            forecast_model=p.forecast_model,
        )
        ranking = make_policy(cfg, self.estimator)
        assert isinstance(ranking, RankingPolicy), type(ranking)
        return ranking

    def _returned(self, session: _Session, now: int) -> None:
        self.ranking.on_access(session.entry, now)  # gap = now - the last request's end

    def _released(self, session: _Session, now: int) -> None:
        entry = session.entry
        entry.num_tokens = entry.num_bytes = session.context_tokens
        self.ranking.on_release(entry, now)

    def _evicted(self, session: _Session, now: int) -> None:
        self.ranking.on_evict(session.entry, now)
