"""Offline tau (tokens per target forward) of the SDSAT drafter: no timing, so it is valid on a shared CPU.

    .venv/bin/python scripts/sdsat_tau.py --prompts humaneval --limit 10 --loops fused,paper [--adapter DIR]
        [--k 4] [--branching 1,1,1,1] [--chains -1] [--check-identical]

Greedy, max 128 new tokens, prompts encoded with the chat template exactly as the benchmark does.  Prints per loop:
tau, forwards, mean tree size, per-depth conditional acceptance; with --check-identical also compares with AR.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specdemo.drafters import make_drafter  # noqa: E402
from specdemo.engine import GenerationConfig, run_to_end  # noqa: E402
from specdemo.prompts import load_prompts  # noqa: E402
from specdemo.target import load_target  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--loops", default="fused,paper")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--k", type=int, default=None, help="default: the drafter's device default")
    ap.add_argument("--branching", default=None)
    ap.add_argument("--chains", type=int, default=None)
    ap.add_argument("--shape", default=None, help="uniform | main")
    ap.add_argument("--lookup", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check-identical", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load_target(args.model)
    prompts = load_prompts(args.prompts)[: args.limit]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    result = {"prompts": args.prompts, "limit": args.limit, "k": args.k, "branching": args.branching,
              "chains": args.chains, "shape": args.shape, "lookup": args.lookup, "loops": {}}
    refs = {}
    if args.check_identical:
        for p in prompts:
            refs[p["id"]] = run_to_end(target, target.encode_prompt(p["prompt"]), None, cfg)[0]
    for loop in args.loops.split(","):
        tokens = forwards = nodes = 0
        tally = None
        same = 0
        for p in prompts:
            opts = dict(k=args.k, loop=loop, branching=args.branching, chains=args.chains, lookup=args.lookup,
                        shape=args.shape)
            if args.adapter:
                opts["adapter"] = args.adapter
            d = make_drafter("sdsat", target, **opts)
            out, events = run_to_end(target, target.encode_prompt(p["prompt"]), d, cfg)
            tokens += len(out)
            forwards += len(events)
            nodes += sum(len(e.tree) for e in events)
            tally = d.tally if tally is None else tally + d.tally
            if args.check_identical:
                same += out == refs[p["id"]]
        acc, prop = tally.accepted, tally.reached
        cond = [round(c, 3) for c in tally.conditional()]
        r = {"tau": round(tokens / forwards, 3), "tokens": tokens, "forwards": forwards,
             "mean_tree_nodes": round(nodes / forwards, 1), "accepted_by_depth": acc, "proposed_by_depth": prop,
             "conditional_acceptance_by_depth": cond}
        if args.check_identical:
            r["identical"] = same / len(prompts)
        result["loops"][loop] = r
        print(loop, json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
