"""`python -m specdemo acceptance`: how much of each method's drafts the target accepts, with no clock involved.

    python -m specdemo acceptance --methods rest,s4c,sdsat --prompts humaneval --limit 10
    python -m specdemo acceptance --methods s4c,s4c:chain --option s4c:chain.tree=chain --cost-curves BENCH.json

Every method decodes the same prompts through the engine (as the bench does: same prompt wrapping, same drafters,
METHOD:LABEL variants with their own --option values) and reports, per method:

    tau                  new tokens / target forwards (AR = 1.00, the bonus token counted, as in the bench)
    modelled_speedup     new tokens / the summed relative cost of the steps' verifications (cost curve, AR step = 1):
                         the speedup if drafting were free and verifying cost what the curve says
    mean_nodes, empty_steps   draft nodes per step, share of steps that sent no draft
    accepted_share       P(a step accepts >= d drafts), d = 1..8
    conditional          P(accepts >= d | accepted >= d-1): how acceptance decays with depth
    given_reached        P(accepts >= d | its tree reached depth d)
    identical            share of prompts whose tokens equal AR's (the engine is lossless; this checks it)

Nothing is timed, so the figures do not depend on the machine's load: safe to run beside other work.  They do depend
on the verify cost curve wherever a drafter sizes its trees by it (REST, S4C, SDSAT, adaptive PLD), which is measured
once at the start unless `--cost-curves` pins the curves saved in a bench JSON (or `--option METHOD.dynamic=false`
turns per-step sizing off).  Speed is the bench's job (`python -m specdemo bench`).
"""
from __future__ import annotations

import json
import sys
from typing import Callable

import torch

from specdemo.bench import parse_options, read_cost_curves
from specdemo.budget import (cost_at, curve_sizes, measure_cost_curves, pin_cost_curves, relative_cost,
                             verify_cost_curve)
from specdemo.drafters import METHODS, make_drafter
from specdemo.engine import GenerationConfig, StepEvent, run_to_end
from specdemo.prompts import load_prompts
from specdemo.sampling import SamplingConfig
from specdemo.target import Target, add_target_args, target_from_args
from specdemo.tree import DepthTally

DEPTHS = 8  # draft depths reported


def step_depth(event: StepEvent) -> int:
    """How deep the step's tree reached with draft nodes (probe nodes are never accepted, so they do not count)."""
    tree = event.tree
    return max((d for i, d in enumerate(tree.depths()) if not tree.is_probe(i)), default=0)


def method_figures(runs: list[list[StepEvent]], refs: list[list[int] | None], rel_cost: dict[int, float]) -> dict:
    """The figures of one method (see the module doc) from its runs' events, one list per prompt, and AR's tokens of
    the same prompts (None: not checked)."""
    tally = DepthTally(DEPTHS)
    new = forwards = nodes = empty = 0
    cost = 0.0
    same = []
    for events, ref in zip(runs, refs):
        tokens = [t for e in events for t in e.tokens]
        new += len(tokens)
        forwards += len(events)
        for e in events:
            tally.add(step_depth(e), e.accepted)
            nodes += e.tree_size
            empty += e.tree_size == 0
            cost += cost_at(rel_cost, e.tree_size)
        if ref is not None:
            same.append(tokens == ref)
    rounded = lambda xs: [None if x is None else round(x, 4) for x in xs]  # noqa: E731
    return {"tau": round(new / forwards, 4) if forwards else None,
            "modelled_speedup": round(new / cost, 4) if cost else None,
            "new_tokens": new, "forwards": forwards,
            "mean_nodes": round(nodes / forwards, 2) if forwards else None,
            "empty_steps": round(empty / forwards, 4) if forwards else None,
            "accepted_share": rounded(tally.share()), "conditional": rounded(tally.conditional()),
            "given_reached": rounded(tally.given_reached()),
            "identical": sum(same) / len(same) if same else None}


def run_acceptance(target: Target, methods: list[str], prompts: list[dict], max_new_tokens: int,
                   sampling: SamplingConfig | None = None, options: dict[str, dict] | None = None,
                   check: bool = True, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Decode `prompts` ({"id", "prompt"}) with each of `methods` (METHOD or METHOD:LABEL; `ar` is added first when
    `check` is on: its tokens are the reference); returns {"methods": {method: figures}, ...settings}."""
    sampling = sampling or SamplingConfig()
    options = options or {}
    methods = (["ar"] if check else []) + [m for m in methods if m != "ar"]
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling)
    encoded = [target.encode_prompt(p["prompt"]) for p in prompts]
    measure_cost_curves(target)  # once, before any drafter sizes a tree by it (a no-op when pinned)
    rel_cost = relative_cost(verify_cost_curve(target, curve_sizes(target)))
    refs: list[list[int] | None] = [None] * len(encoded)
    result = {"model": target.name, "max_new_tokens": max_new_tokens, "sampling": vars(sampling),
              "prompts": len(encoded), "relative_cost": {str(k): v for k, v in rel_cost.items()}, "methods": {}}
    for m in methods:
        runs = []
        for i, ids in enumerate(encoded):
            if progress:
                progress(m, i, len(encoded))
            drafter = make_drafter(m.split(":")[0], target, **options.get(m, {}))  # "s4c:chain": a labelled variant
            runs.append(run_to_end(target, ids, drafter, cfg)[1])
        if m == "ar" and check:
            refs = [[t for e in events for t in e.tokens] for events in runs]
        result["methods"][m] = method_figures(runs, refs, rel_cost)
    return result


def format_lines(result: dict) -> str:
    """One line per method: tau, modelled speedup, nodes per step, identical, and the conditional acceptance."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"{'method':<14} {'tau':>6} {'model x':>7} {'nodes':>6} {'empty':>6} {'identical':>9}  "
             f"P(accept d | d-1), d = 1..{DEPTHS}"]
    for m, r in result["methods"].items():
        cond = " ".join(fmt(c, ".2f") for c in r["conditional"])
        lines.append(f"{m:<14} {fmt(r['tau'], '6.3f')} {fmt(r['modelled_speedup'], '7.3f')} "
                     f"{fmt(r['mean_nodes'], '6.1f')} {fmt(r['empty_steps'], '6.2f')} {fmt(r['identical'], '9.2f')}  "
                     f"{cond}")
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("acceptance", help="acceptance of each method's drafts (tau, per depth), nothing timed")
    add_target_args(p)
    p.add_argument("--methods", default="pld,rest,s4c,sdsat",
                   help=f"comma list of {','.join(METHODS)}; METHOD:LABEL runs a labelled variant "
                        "(options via --option METHOD:LABEL.NAME=VALUE)")
    p.add_argument("--prompts", default="humaneval",
                   help="humaneval | chat | spec_bench | spec_bench:tune | spec_bench:check | PATH.jsonl")
    p.add_argument("--limit", type=int, default=10, help="the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", default=[], help="METHOD.NAME=VALUE drafter option, repeatable")
    p.add_argument("--no-check", action="store_true", help="skip the AR reference runs (no `identical`; faster)")
    p.add_argument("--cost-curves", default=None, metavar="BENCH.json",
                   help="size trees by the cost curves saved in a bench JSON instead of measuring them here")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.limit <= 0 or args.max_new_tokens <= 0:
        raise ValueError("--limit and --max-new-tokens must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    options = parse_options(args.option)
    prompts = load_prompts(args.prompts)[: args.limit]
    saved = read_cost_curves(args.cost_curves) if args.cost_curves else None
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
    sampling.validate()
    target = target_from_args(args)
    if saved:
        pin_cost_curves(target, saved)

    def progress(method: str, i: int, n: int) -> None:
        print(f"\r{method:<14} {i + 1}/{n}", end="", file=sys.stderr, flush=True)

    result = run_acceptance(target, methods, prompts, args.max_new_tokens, sampling, options, not args.no_check,
                            progress)
    print("", file=sys.stderr)
    result["command"] = "python -m specdemo acceptance " + " ".join(
        sys.argv[2:] if sys.argv[1:2] == ["acceptance"] else [])
    print(format_lines(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
