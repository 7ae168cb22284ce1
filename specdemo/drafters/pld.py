"""Prompt-lookup decoding: draft by copying what followed the latest earlier occurrence of the current n-gram.

As HF's `prompt_lookup_num_tokens` and vLLM's ngram proposer: try n-gram sizes from `max_ngram` down to `min_ngram`
over prompt + output so far; the most recent match wins; its continuation (up to `num_tokens`) is a chain draft.

Cost-aware length (`adaptive=True`, the default): where a verification forward over k extra tokens costs much more
than a 1-token step (CPU: ~1.5x already at k = 2), blindly sending 10 tokens makes PLD slower than AR (HF's PLD runs
at 0.56x of HF greedy on the dev machine).  So the drafter keeps, per matched n-gram size, an online estimate of the
per-token acceptance rate p (accepted / (accepted + first rejections), prior 1:1) and sends the prefix length k that
maximises expected tokens per unit of cost, (1 + p + ... + p^k) / cost(k), with cost(k) from the measured verify
cost curve (`specdemo.budget`).  k = 0 (a plain AR step) wins when no match is worth its cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine import DecodeState, Drafter, Verified
from ..tree import DraftTree


@dataclass
class PromptLookupDrafter(Drafter):
    num_tokens: int = 10
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    name: str = "pld"
    rel_cost: dict[int, float] | None = None  # relative verify cost by draft size; measured when None and adaptive
    stats: dict[int, list[int]] = field(default_factory=dict)  # n-gram size -> [accepted tokens, rejections]
    _last: tuple[int, int] = (0, 0)  # (n-gram size, draft length) of the pending proposal

    def begin(self, state: DecodeState, prompt_hidden) -> None:
        if self.adaptive and self.rel_cost is None:
            from ..budget import relative_cost, verify_cost_curve

            self.rel_cost = relative_cost(verify_cost_curve(state.target, (0, 1, 2, 4, 8, 16)))

    def propose(self, state: DecodeState) -> DraftTree:
        n, draft = lookup_with_size(state.tokens, self.num_tokens, self.max_ngram, self.min_ngram)
        if draft and self.adaptive and self.rel_cost:
            draft = draft[: self._best_length(n, len(draft))]
        self._last = (n, len(draft))
        return DraftTree.chain(draft, "context")

    def _best_length(self, n: int, longest: int) -> int:
        from ..budget import cost_at

        acc, rej = self.stats.get(n, [0, 0])
        p = (acc + 1) / (acc + rej + 2)
        best_k, best_rate, expected = 0, 1.0, 1.0
        for k in range(1, longest + 1):
            expected += p**k
            rate = expected / cost_at(self.rel_cost, k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def observe(self, state: DecodeState, verified: Verified) -> None:
        n, k = self._last
        if k:
            acc = len(verified.accepted_nodes)
            s = self.stats.setdefault(n, [0, 0])
            s[0] += acc
            s[1] += acc < k  # stopped by a rejection (not by running out of draft)


def make(target, **options) -> PromptLookupDrafter:
    return PromptLookupDrafter(**options)


def unavailable_reason(target) -> str | None:
    return None  # needs nothing but the request itself


def lookup(tokens: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation of the latest earlier occurrence of the longest matching suffix n-gram."""
    return lookup_with_size(tokens, num_tokens, max_ngram, min_ngram)[1]


def lookup_with_size(tokens: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> tuple[int, list[int]]:
    """(n-gram size, continuation) of the latest earlier occurrence of the longest matching suffix n-gram."""
    seq = np.asarray(tokens, dtype=np.int64)
    n_tok = len(seq)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # starts 0 .. n_tok-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        for start in hits[::-1]:  # latest first; skip matches with nothing after them
            cont = seq[start + n : start + n + num_tokens]
            if len(cont):
                return n, cont.tolist()
    return 0, []

