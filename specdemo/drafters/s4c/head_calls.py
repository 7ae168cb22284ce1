"""Whether S4C's deeper heads are worth calling in a step: the per-step cut's rule (`budget.size_and_rate`) applied
before the calls, to the nodes the calls are expected to add and to what the calls themselves cost.

Why: a head call (a decoder layer, then the draft vocabulary's scores, for 1-10 rows) takes ~1.5-2 ms on the 2-core
CPU whatever the target's precision, while the step it drafts for takes ~45 ms at fp32 and ~15 ms at int4.  At fp32
the deeper heads pay for their calls; at int4 each call costs a tenth of a step and the small trees that int4's
steep cost curve affords keep few of their nodes (tune prompts, docs/s4c.md: int4 S4C with head 1 alone was faster
than with all three heads, fp32 slower).  So the step weighs, before calling heads d..H, its best rate
(1 + Σ p) / (cost(n) + drafting) with the tree so far against the same with the nodes those heads are expected to add
and the calls' time added to the drafting.  A head's expected children are its running mean of the k-th candidate's
probability given the parent, times the parent's path probability, through the calibration; the times are measured
in the step itself (a head call's seconds, and an AR step's seconds in place, from the verifications the drafter sends).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from specdemo.budget import running_step_seconds, size_and_rate

PRIOR_ROWS = 4  # a deeper head's candidate probabilities start as head 1's, worth this many rows of its own


@dataclass
class HeadCallPricing:
    """One request's running estimates: what a deeper head's candidates are worth and what its call and a step cost."""

    n_heads: int
    step_seconds: float  # an AR step, in place: starts at the cost curve's, then follows the verifications sent
    call_seconds: float = 0.0  # a deeper head call (its layer and scores); 0 until one is timed
    calls: int = 0
    top_sums: list[list[float]] = field(init=False)  # per head, Σ over rows of its k-th candidate's probability
    top_rows: list[int] = field(init=False)  # per head, the rows summed
    _sent: tuple[float, float] | None = field(default=None, init=False)  # (when a tree went to verification, its cost)

    def __post_init__(self) -> None:
        self.top_sums = [[] for _ in range(self.n_heads)]
        self.top_rows = [0] * self.n_heads

    def saw(self, depth: int, logps: list[list[float]]) -> None:
        """Head `depth`'s candidates' log-probabilities given their parents, a row per parent."""
        sums = self.top_sums[depth - 1]
        for row in logps:
            for k, lp in enumerate(row):
                if k == len(sums):
                    sums.append(0.0)
                sums[k] += math.exp(lp)
        self.top_rows[depth - 1] += len(logps)

    def mean_top(self, depth: int, k: int) -> list[float]:
        """Head `depth`'s mean probability of its 1st..k-th candidate given the parent, shrunk towards head 1's (seen
        every step) by PRIOR_ROWS rows: a deeper head is seen only where it is called, and a few unsure first rows
        alone would keep it from being called again.  1.0 before head 1 is seen: as sure as the parent."""
        prior = [1.0] * k if depth == 1 or not self.top_rows[0] else self.mean_top(1, k)
        sums, rows = self.top_sums[depth - 1], self.top_rows[depth - 1]
        if not rows:
            return prior
        w = 0 if depth == 1 else PRIOR_ROWS
        return [((sums[i] if i < len(sums) else 0.0) + w * prior[i]) / (rows + w) for i in range(k)]

    def timed_call(self, seconds: float) -> None:
        self.calls += 1
        self.call_seconds += (seconds - self.call_seconds) / self.calls

    def sent(self, relative_cost: float) -> None:
        """A tree of that relative cost goes to verification now."""
        self._sent = (time.perf_counter(), relative_cost)

    def verified(self) -> None:
        """The tree sent last has been verified: its seconds per AR step join the running estimate."""
        if self._sent is not None:
            start, cost = self._sent
            self.step_seconds = running_step_seconds(self.step_seconds, time.perf_counter() - start, cost)
            self._sent = None

    def pays(self, now: list[float], expected: list[list[float]], rel: dict[int, float], budget: int,
             drafting_seconds: float) -> bool:
        """Whether calling the next heads beats stopping: `now` the calibrated scores of the tree so far,
        `expected[j]` those the next j + 1 heads are expected to add, `drafting_seconds` this step's drafting so
        far (in the step's cost either way)."""
        sunk, call = drafting_seconds / self.step_seconds, self.call_seconds / self.step_seconds
        best_now = size_and_rate(sorted(now, reverse=True)[:budget], rel, overhead=sunk)[1]
        return any(size_and_rate(sorted(now + more, reverse=True)[:budget], rel, overhead=sunk + (j + 1) * call)[1]
                   > best_now for j, more in enumerate(expected))

