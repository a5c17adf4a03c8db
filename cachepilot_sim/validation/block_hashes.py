"""Which KV blocks a replayed request shares: the engine's rule for registering a block's hash.

transformers 5.17 continuous batching hashes a block (makes it findable by a later prompt) after
the step that computed its last token, prefill and decode steps alike (`complete_blocks` of every
scheduled request, `mark_shareable_blocks_as_complete` with prompt + generated tokens), except in
the update that finishes the request (its status is FINISHED there). A request of P prompt and
O >= 2 output tokens thus leaves the full blocks of its first P + O - 2 tokens shareable; a
follow-up turn, whose prompt is P + the reply + new text, hits blocks its parent's reply filled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# (prompt tokens, output tokens, block tokens) -> leading blocks shareable once the request ends
SharedBlocksRule = Callable[[int, int, int], int]


def num_shared_blocks(prompt_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """Leading full blocks of prompt + reply that transformers CB has hashed when the request
    ends: every block complete after the step that produced the next-to-last token (its KV then
    holds P + O - 2 tokens), and never fewer than the prompt's full blocks. Not modelled: a
    one-token reply registers none of the request's own blocks in the engine (the finishing step
    skips marking), and under async batching a split prompt's next-to-last chunk is not marked
    when the last chunk was scheduled before its update (the engine's count then lags)."""
    return max(prompt_tokens // block_tokens, (prompt_tokens + output_tokens - 2) // block_tokens)


def num_shared_blocks_vllm(prompt_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """vLLM v1 (0.26 `KVCacheManager.cache_blocks`, called for every scheduled step) hashes a
    block as soon as its KV is computed, prompt and reply alike; the last sampled token's KV is
    never computed, so a request of P prompt and O output tokens leaves the full blocks of its
    first P + O - 1 tokens shareable."""
    return max(prompt_tokens // block_tokens, (prompt_tokens + output_tokens - 1) // block_tokens)


# engine.json `engine` -> its rule; any other engine: transformers' (num_shared_blocks)
SHARED_BLOCKS_RULES: dict[str, SharedBlocksRule] = {"vllm_v1": num_shared_blocks_vllm}


def shared_blocks_rule(engine: object) -> SharedBlocksRule:
    """The shared-blocks rule of the engine a ground truth names (engine.json `engine`)."""
    if not isinstance(engine, str):
        return num_shared_blocks
    return SHARED_BLOCKS_RULES.get(engine, num_shared_blocks)


def num_prompt_blocks_only(prompt_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """The opposite rule, for tests: blocks completed while decoding are never shared."""
    return prompt_tokens // block_tokens


class _Ids:
    """Dense ids in first-seen order: a column hash keeps its id, a fresh block takes a new one."""

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        self.num_ids = 0

    def known(self, h: int) -> int:
        dense = self.of.get(h)
        if dense is None:
            dense = self.of[h] = self.fresh()
        return dense

    def fresh(self) -> int:
        self.num_ids += 1
        return self.num_ids - 1


def replay_hash_ids(
    prompt: Sequence[int],
    output: Sequence[int],
    parent: Sequence[int],
    block_tokens: int,
    column: Sequence[Sequence[int] | None] | None = None,
    rule: SharedBlocksRule = num_shared_blocks,
) -> list[list[int]]:
    """Per request (rows in send order, parents first), the hash ids the simulator's prefix cache
    holds for it: one per prompt block, then, for a request with a child, one per block its reply
    fills that the engine shares (`rule`): the simulator caches a request's hash blocks, allocated
    at admission, and nothing it decodes (a request nobody continues keeps its reply private, so
    its KV grows as it decodes; its own re-prefill after a preemption hits no reply block).

    A request's full prompt blocks are named by `column` (the ground truth's `block_hash_ids`:
    equal ids are equal prefixes, whoever sent them) or, without one, by its parent's shared
    blocks (`parent[i]` its row, -1: none); other blocks are its own. A shared block past the full
    prompt blocks is named as the first child names it (column) or is the request's own (chains),
    so a child's prompt, which holds its parent's prompt and reply, finds it. A partial last
    block is never shared (the engine hashes complete blocks only)."""
    children: dict[int, int] = {}
    for i, p in enumerate(parent):
        if p >= 0:
            children.setdefault(p, i)
    ids = _Ids()
    shared: list[list[int]] = []
    out: list[list[int]] = []
    for i, tokens in enumerate(prompt):
        num_full = tokens // block_tokens
        own = column[i] if column is not None else None
        if own is not None:
            lead = [ids.known(int(h)) for h in own[:num_full]]
        elif column is None and parent[i] >= 0:
            lead = shared[parent[i]][:num_full]
        else:
            lead = []
        child = children.get(i)
        num_blocks = -(-tokens // block_tokens)
        num_shared = rule(tokens, output[i], block_tokens)
        if child is None:  # nobody continues its reply: its blocks beyond the prompt stay private
            num_shared = min(num_shared, num_blocks)
        named = column[child] if column is not None and child is not None else None
        chain = list(lead)
        for k in range(len(lead), max(num_blocks, num_shared)):
            if k < num_shared and named is not None and k < len(named):
                chain.append(ids.known(int(named[k])))
            else:
                chain.append(ids.fresh())
        shared.append(chain[:num_shared])
        out.append(chain)
    return out
