"""The figures every readout shows, defined once: the bench's table, the race's summary and the page's plots all read
them from here, so a number on the page and the same number in a bench JSON are computed alike.

tau = new tokens ÷ target forwards (the bonus token counted, AR = 1.00, as Spec-Bench counts it); tokens/s = new
tokens ÷ the run's own compute seconds; speedup = a method's tokens/s ÷ AR's over the same prompts; acceptance by
depth = the share of steps that accepted at least d drafted tokens.  Plain Python (no torch): the app's record and its
JSON import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

DEPTHS = 8  # draft depths the acceptance-by-depth figures report


def tau(new_tokens: int, forwards: int) -> float | None:
    """Tokens per target forward; None when nothing ran."""
    return new_tokens / forwards if forwards else None


def tokens_per_s(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else 0.0


def speedup(method_tps: float, baseline_tps: float) -> float | None:
    """None unless both sides have produced tokens (a ratio against nothing is no figure)."""
    return method_tps / baseline_tps if method_tps and baseline_tps else None


def acceptance_by_depth(accept_lengths: Sequence[int], depth: int = DEPTHS) -> list[float]:
    """Share of steps that accepted >= d draft tokens, d = 1..depth (a step's accept length counts its own token)."""
    steps = len(accept_lengths)
    return [round(sum(a - 1 > d for a in accept_lengths) / steps, 4) if steps else 0.0 for d in range(depth)]


def first_difference(a: Sequence[int], b: Sequence[int], complete: bool) -> int | None:
    """The first index where two token lists differ, over their common prefix; once both runs are `complete`, a
    length mismatch is a difference at the shorter one's end."""
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), None)
    if diff is None and complete and len(a) != len(b):
        diff = n
    return diff


@dataclass
class Summary:
    """One method's run against the baseline's, both measured here and now."""

    speedup: float | None  # method tokens/s ÷ baseline tokens/s
    tau: float  # method tokens per target forward
    forwards: int  # method target forwards
    baseline_forwards: int
    identical: bool  # token lists equal (over the common prefix while a run is unfinished)
    complete: bool  # both runs reached their end
    first_difference: int | None  # index of the first differing token, if any
    tie_gap: float | None = None  # AR's top-2 logit gap at that token (small: a near-tie that flipped)

    @property
    def forwards_saved(self) -> int:
        return self.baseline_forwards - self.forwards

    def as_json(self) -> dict:
        return {"speedup": self.speedup, "tau": self.tau, "forwards": self.forwards,
                "baseline_forwards": self.baseline_forwards, "forwards_saved": self.forwards_saved,
                "identical": self.identical, "complete": self.complete, "first_difference": self.first_difference,
                "tie_gap": self.tie_gap}


class RunLike(Protocol):
    """What `summarize` reads of a run (the race's Run has it)."""

    tokens: list[int]
    done: bool
    tokens_per_s: float
    tau: float
    forwards: int
    margins: list[float]  # per token: the target's top-2 logit gap where it chose it


def summarize(baseline: RunLike, method: RunLike) -> Summary:
    """`method` against `baseline` (anything with tokens, done, tokens_per_s, tau and forwards)."""
    complete = baseline.done and method.done
    diff = first_difference(baseline.tokens, method.tokens, complete)
    return Summary(speedup(method.tokens_per_s, baseline.tokens_per_s), method.tau, method.forwards,
                   baseline.forwards, diff is None, complete, diff, gap_at(baseline.margins, diff))


def gap_at(margins: Sequence[float], index: int | None) -> float | None:
    """The top-2 logit gap at token `index` (None where there is no difference or no such token)."""
    return margins[index] if index is not None and index < len(margins) else None


def figures(runs: Sequence[dict], baseline_tokens: dict, baseline_tps: float) -> dict:
    """The bench's figures over some prompts' runs ({"id", "tokens", "wall_time", "accept_lengths"} each):
    tokens/s, speedup against `baseline_tps` (AR over the same prompts), tau and the share identical to AR."""
    steps = sum(len(r["accept_lengths"]) for r in runs)
    new = sum(len(r["tokens"]) for r in runs)
    same = [r["tokens"] == baseline_tokens[r["id"]] for r in runs]
    tps = runs_tokens_per_s(runs)
    return {"tokens_per_s": tps, "speedup": tps / baseline_tps if baseline_tps else None, "tau": tau(new, steps),
            "identical": sum(same) / len(same) if same else None, "prompts": len(runs)}


def runs_tokens_per_s(runs: Sequence[dict]) -> float:
    return tokens_per_s(sum(len(r["tokens"]) for r in runs), sum(r["wall_time"] for r in runs))
