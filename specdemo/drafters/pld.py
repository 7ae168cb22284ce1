"""Prompt-lookup decoding: draft by copying what followed the latest earlier occurrence of the current n-gram.

As HF's `prompt_lookup_num_tokens` and vLLM's ngram proposer: try n-gram sizes from `max_ngram` down to `min_ngram`
over prompt + output so far; the most recent match wins; its continuation (up to `num_tokens`) is a chain draft.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine import DecodeState, Drafter
from ..tree import DraftTree


@dataclass
class PromptLookupDrafter(Drafter):
    num_tokens: int = 10
    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "pld"

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.chain(lookup(state.tokens, self.num_tokens, self.max_ngram, self.min_ngram), "context")


def lookup(tokens: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation of the latest earlier occurrence of the longest matching suffix n-gram (vectorised scan)."""
    seq = np.asarray(tokens, dtype=np.int64)
    n_tok = len(seq)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # starts 0 .. n_tok-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        for start in hits[::-1]:  # latest first; skip matches with nothing after them
            cont = seq[start + n : start + n + num_tokens]
            if len(cont):
                return cont.tolist()
    return []


def make(target, **options) -> PromptLookupDrafter:
    return PromptLookupDrafter(**options)


def unavailable_reason(target) -> str | None:
    return None  # needs nothing but the request itself
