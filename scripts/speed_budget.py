"""What a speedup bar asks of a mode, read from one bench run's JSON: how much of AR's time is the prompts' prefill
(which no drafter shortens), the decoding speedup the bar then needs, and what that means at the mode's measured
step cost (the τ it would need) or at the bar's own τ (the step cost it may have, in AR steps).

    python scripts/speed_budget.py RUN.json --bar s4c=1.8:2.9 --bar rest=1.7:2.3 [--bar METHOD=SPEEDUP[:TAU] ...]

Why: a mode's speedup is Amdahl's law over two parts, the prefill (the same in every mode) and the decoding steps
(τ tokens each at the step's cost), so a bar on the whole run is a bar on the steps that grows with the prefill's
share. Reads `per_prompt`'s `wall_time`, `prefill_s`, `new_tokens` and `accept_lengths`; needs no model.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass


@dataclass
class Split:
    """One method's run over the prompts: wall seconds, the prefill's seconds, new tokens, decoding steps."""
    wall: float
    prefill: float
    tokens: int
    steps: int

    @property
    def step_s(self) -> float:
        return (self.wall - self.prefill) / self.steps

    @property
    def tau(self) -> float:
        return self.tokens / self.steps


def split(per_prompt: list[dict]) -> Split:
    return Split(sum(p["wall_time"] for p in per_prompt), sum(p["prefill_s"] for p in per_prompt),
                 sum(p["new_tokens"] for p in per_prompt), sum(len(p["accept_lengths"]) for p in per_prompt))


def budget(ar: Split, mode: Split, bar: float, bar_tau: float | None) -> dict:
    """The decoding time the bar leaves the mode (its own prefill kept), the decoding speedup that is, the τ needed
    at the mode's measured step cost and, given the bar's τ, the step cost allowed (in AR steps)."""
    decode_left = ar.wall / bar - mode.prefill
    out = {"prefill_share": ar.prefill / ar.wall, "decode_speedup": (ar.wall - ar.prefill) / (mode.wall - mode.prefill),
           "decode_speedup_needed": (ar.wall - ar.prefill) / decode_left if decode_left > 0 else float("inf"),
           "step_cost": mode.step_s / ar.step_s,
           "tau_needed_at_step_cost": mode.tokens * mode.step_s / decode_left if decode_left > 0 else float("inf")}
    if bar_tau is not None:  # none at all (0) where the prefill alone exceeds the bar's time
        out["step_cost_allowed_at_bar_tau"] = max(decode_left, 0.0) * bar_tau / mode.tokens / ar.step_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a bench run's JSON (python -m specdemo bench ... --json FILE)")
    ap.add_argument("--bar", action="append", default=[], metavar="METHOD=SPEEDUP[:TAU]")
    args = ap.parse_args()
    run = json.load(open(args.run))
    methods = run["methods"]
    ar = split(methods["ar"]["per_prompt"])
    print(f"{args.run}: AR {ar.wall:.1f} s, of which prefill {ar.prefill:.1f} s ({ar.prefill / ar.wall:.0%}); "
          f"AR step {1e3 * ar.step_s:.2f} ms")
    for spec in args.bar:
        name, _, target = spec.partition("=")
        speed, _, tau = target.partition(":")
        mode = split(methods[name]["per_prompt"])
        b = budget(ar, mode, float(speed), float(tau) if tau else None)
        line = (f"{name:10s} now {ar.wall / mode.wall:.2f}x τ {mode.tau:.2f}, decoding {b['decode_speedup']:.2f}x at "
                f"{b['step_cost']:.2f} AR steps a step | bar {float(speed):.2f}x needs decoding "
                f"{b['decode_speedup_needed']:.2f}x: τ {b['tau_needed_at_step_cost']:.2f} at today's step cost")
        if tau:
            line += f", or at τ {float(tau):.2f} a step of at most {b['step_cost_allowed_at_bar_tau']:.2f} AR steps"
        print(line)


if __name__ == "__main__":
    main()
