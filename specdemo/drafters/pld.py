"""Prompt-lookup decoding: draft by copying what followed the latest earlier occurrence of the current n-gram.

As HF's `prompt_lookup_num_tokens` and vLLM's ngram proposer: try n-gram sizes from `max_ngram` down to `min_ngram`
over prompt + output so far; the most recent match wins; its continuation (up to `num_tokens`) is a chain draft.

Cost-aware length (`adaptive=True`, the default): on a CPU a verification forward over k extra tokens costs much more
than a 1-token step (2-core dev machine: ~1.5x at k = 1, ~1.7x for k = 2..12), so blindly sending 10 tokens makes
PLD slower than AR (HF's PLD runs at 0.56x of HF greedy there).  The drafter therefore estimates the per-token
acceptance rate p (matched / (matched + first mismatches), prior 1:1) for each *situation* -- the matched n-gram size
and whether the previous lookup's first token came true, because copying comes in streaks -- and sends the prefix
length k that maximises expected tokens per unit of cost, (1 + p + ... + p^k) / cost(k), with cost(k) from the
measured verify cost curve (`specdemo.budget`).  k = 0 (a plain AR step) wins when no match is worth its cost.

The estimates come from *every* lookup, sent or not: each continuation is kept as a shadow and scored against the
tokens that actually get committed (exactly what verification would have accepted, greedy or sampled, since the
target's choice at a position does not depend on the draft).  So a situation judged not worth drafting keeps being
re-measured.  Estimates belong to one request (so a request's speed never depends on the ones before it) and decay
(halved past 200 observations) as the text moves on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdemo.budget import cost_at, curve_sizes, relative_cost, verify_cost_curve
from specdemo.drafters.contract import PROMPT, Knob, Option
from specdemo.engine import DecodeState, Drafter, Verified
from specdemo.tree import DraftTree

DECAY_AT = 200


@dataclass
class PromptLookupDrafter(Drafter):
    num_tokens: int = 10
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    name: str = "pld"
    rel_cost: dict[int, float] | None = None  # relative verify cost by draft size; measured when None and adaptive
    stats: dict[tuple[int, bool], list[float]] = field(default_factory=dict, init=False)  # (n-gram length, hit) -> [matched, misses]
    _shadows: list[tuple[tuple[int, bool], int, list[int]]] = field(default_factory=list)  # (situation, pos, cont)
    _hit: bool = False  # did the previous lookup's first token come true?

    def begin(self, state: DecodeState, prompt_hidden) -> None:
        if self.adaptive and self.rel_cost is None:
            self.rel_cost = relative_cost(verify_cost_curve(state.target, curve_sizes(state.target)))
        self.stats, self._shadows, self._hit = {}, [], False

    def propose(self, state: DecodeState) -> DraftTree:
        ngram_length, draft = lookup_with_ngram_length(state.tokens, self.num_tokens, self.max_ngram, self.min_ngram)
        situation = (ngram_length, self._hit)
        self._hit = False
        if draft:
            self._shadows.append((situation, len(state.tokens), draft))
            if self.adaptive and self.rel_cost:
                draft = draft[: self._best_length(situation, len(draft))]
        return DraftTree.chain(draft, PROMPT.name)

    def acceptance_rate(self, situation: tuple[int, bool]) -> float:
        matched, misses = self.stats.get(situation, (0, 0))
        return (matched + 1) / (matched + misses + 2)

    def _best_length(self, situation: tuple[int, bool], longest: int) -> int:
        p = self.acceptance_rate(situation)
        best_k, best_rate, expected = 0, 1.0, 1.0
        for k in range(1, longest + 1):
            expected += p**k
            rate = expected / cost_at(self.rel_cost, k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def observe(self, state: DecodeState, verified: Verified) -> None:
        """Score the pending shadows against the committed tokens."""
        tokens, pending = state.tokens, []
        this_step = len(tokens) - len(verified.tokens)  # position of the first token committed by this step
        for situation, pos, cont in self._shadows:
            done = tokens[pos : pos + len(cont)]
            m = next((j for j, (a, b) in enumerate(zip(cont, done)) if a != b), None)
            if pos == this_step:
                self._hit = done[0] == cont[0]
            if m is None and len(done) < len(cont):
                pending.append((situation, pos, cont))  # not decided yet
                continue
            s = self.stats.setdefault(situation, [0.0, 0.0])
            s[0] += len(cont) if m is None else m
            s[1] += m is not None
            if s[0] + s[1] > DECAY_AT:
                s[0], s[1] = s[0] / 2, s[1] / 2
        self._shadows = pending


def make(target, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1, adaptive: bool = True
         ) -> PromptLookupDrafter:
    if min_ngram > max_ngram:
        raise ValueError(f"Prompt lookup needs min_ngram <= max_ngram (got {min_ngram} and {max_ngram}).")
    return PromptLookupDrafter(num_tokens, max_ngram, min_ngram, adaptive)


OPTIONS = (
    Option("num_tokens", "int", 1, 64, help="most tokens copied after a match"),
    Option("max_ngram", "int", 1, 16, help="longest suffix of the output looked up in the context"),
    Option("min_ngram", "int", 1, 16, help="shortest suffix looked up"),
    Option("adaptive", "bool", help="size each draft from the measured verify cost and the running acceptance"),
)


def unavailable_reason(target) -> str | None:
    return None  # needs nothing but the request itself


def lookup(tokens: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation of the latest earlier occurrence of the longest matching suffix n-gram."""
    return lookup_with_ngram_length(tokens, num_tokens, max_ngram, min_ngram)[1]


def lookup_with_ngram_length(tokens: list[int], num_tokens: int, max_ngram: int = 3,
                             min_ngram: int = 1) -> tuple[int, list[int]]:
    """(length of the matched n-gram, continuation) of the latest earlier occurrence of the longest matching suffix
    n-gram; (0, []) when none matches.  The length is what grafting drafters score the continuation by."""
    seq = np.asarray(tokens, dtype=np.int64)
    # every earlier match ends where the last token occurs before the end; longer n-grams only filter those ends
    # (a comparison per candidate and length, not a window over the whole context per length: drafters call this
    # every step on contexts of thousands of tokens)
    ends = np.flatnonzero(seq[:-1] == seq[-1]) if len(seq) > 1 else seq[:0]
    for n in range(min(max_ngram, len(seq) - 1), max(min_ngram, 1) - 1, -1):
        hits = ends[ends >= n - 1]
        for back in range(1, n):
            hits = hits[seq[hits - back] == seq[-1 - back]]
        if len(hits):  # the latest wins; something always follows it, since it ends before the last token
            return n, seq[hits[-1] + 1 : hits[-1] + 1 + num_tokens].tolist()
    return 0, []


SOURCES = (PROMPT,)

KNOBS = (
    Knob("pld", "num_tokens", "Draft length", 1, 32, 10, "tokens copied after a match"),
    Knob("pld", "max_ngram", "Longest n-gram matched", 1, 8, 3, "the suffix looked up in the context"),
)
