"""What the root's probe costs a verification and brings the next step, measured in the request itself.

Why: the per-step cut (`SDSATDrafter._cut`) weighs each step with and without the root's probe row. Two guesses made
that weighing keep a probe that did not pay at int4 on the 2-core CPU (12 tune prompts, 64 tokens: SDSAT 0.90x int4
AR as it was, 1.08x with the probe always left out):
- its price: a probe row costs more than the cost curve's price of one more row — the adapter's hooks and LoRA
  products on it, its own masked attention call at bf16 and int4, the LM head over it — so steps that sent it
  verified in 36 ms against 24 ms without it;
- its worth: the tokens its drafts are accepted for in the next step were credited in full, though those drafts are
  rows the next step pays for too.
So the drafter times its verifications (from the tree leaving `propose` to `observe`): the steps without a probe give
an AR step's seconds in place, the steps with one how many AR steps beyond the curve's price they took (`overhead`);
and a step that verifies a probe's drafts credits the probe with its accepted drafts less what their rows cost at
the request's running pace (`net_yield`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from specdemo.budget import cost_at, running_step_seconds

PRIOR_STEPS = 2.0  # the estimates start at their priors with the weight of this many steps: one step is noise
PRIOR_YIELD = 0.25  # net tokens a probe's drafts bring the next step, before any is seen


@dataclass
class ProbePricing:
    """One request's running estimates of what a root probe costs beyond the curve and brings the next step."""

    rel_cost: dict[int, float]  # the cost curve, in AR steps by draft nodes
    unit_seconds: float  # an AR step's seconds in place: the cost curve's to start, then the plain steps'
    probe_seconds: float = 0.0  # Σ over timed probe steps of their seconds
    probe_price: float = 0.0  # Σ over timed probe steps of the curve's price of their nodes (AR steps)
    probe_steps: int = 0
    tokens: float = 0.0  # Σ tokens every step committed, and Σ the curve's price of the trees they verified:
    price: float = 0.0  # the request's pace in tokens per AR step
    yield_sum: float = 0.0  # Σ over the steps after a probe step of the net tokens its drafts brought (0: none sent)
    yield_steps: int = 0
    _after_probe: bool = field(default=False, init=False)  # the step verified last sent the root's probe
    _sent: tuple[float, int, bool] | None = field(default=None, init=False)  # (when, nodes, with a probe)
    _skip_first: bool = field(default=True, init=False)  # the first verification after the prefill runs cold

    @property
    def overhead(self) -> float:
        """A probe step's expected AR steps beyond the curve's price of its nodes (never below zero), the probe steps'
        seconds read in the current AR step. Before any is timed, the price of one more row: the tune prompts' probe
        steps took about that much beyond their price (int4 0.2-0.3 AR steps against a row's 0.3, bf16 0.13 against
        0.1, fp32 0.1 against 0.03), so a request does not first pay for probes where rows are dear."""
        excess = self.probe_seconds / self.unit_seconds - self.probe_price
        prior = cost_at(self.rel_cost, 1) - 1.0
        return max(0.0, (excess + PRIOR_STEPS * prior) / (self.probe_steps + PRIOR_STEPS))

    @property
    def net_yield(self) -> float:
        """Tokens a root probe is expected to add to the next step, net of its drafts' rows there: over every probe
        step, also those whose drafts the next step did not send (its accepted path carried no probe, or the cut left
        the drafts out)."""
        return (self.yield_sum + PRIOR_STEPS * PRIOR_YIELD) / (self.yield_steps + PRIOR_STEPS)

    def sent(self, nodes: int, probe: bool) -> None:
        """A tree of `nodes` nodes, with or without the root's probe, goes to verification now."""
        self._sent = (time.perf_counter(), nodes, probe)

    def verified(self, committed: int, drafted: int, drafted_accepted: int) -> None:
        """The tree sent last has been verified: it committed `committed` tokens, of which `drafted_accepted` among
        the `drafted` nodes a probe drafted the step before."""
        if self._sent is None:
            return
        start, nodes, probe = self._sent
        seconds, self._sent = time.perf_counter() - start, None
        price = cost_at(self.rel_cost, nodes)
        self.tokens += committed
        self.price += price
        if self._after_probe:  # the probe's drafts' accepted tokens less what their rows cost at the request's pace
            rows = price - cost_at(self.rel_cost, nodes - drafted)
            self.yield_sum += drafted_accepted - rows * self.tokens / self.price
            self.yield_steps += 1
        self._after_probe = probe
        if self._skip_first:
            self._skip_first = False
        elif probe:
            self.probe_seconds += seconds
            self.probe_price += price
            self.probe_steps += 1
        else:
            self.unit_seconds = running_step_seconds(self.unit_seconds, seconds, price)

