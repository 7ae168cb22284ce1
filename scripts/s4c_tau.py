"""Offline S4C acceptance: tau (new tokens per target forward, bonus token included) per tree type, no timing.

    nice -n 5 .venv/bin/python scripts/s4c_tau.py --prompts humaneval --limit 10 --trees s4c,chain,eagle

Greedy, `--max-new-tokens` 128, the prompts wrapped exactly as the benchmark does (specdemo.prompts).  Also checks
that every output equals plain AR decoding and prints the conditional acceptance per depth.  tau does not depend on
machine load, so this is safe to run on a busy machine; speed is measured by `python -m specdemo bench`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--heads", default=None, help="heads folder (default: the shipped heads)")
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--trees", default="s4c,chain,eagle")
    ap.add_argument("--budget", type=int, default=15)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=0, help="hybrid: graft a prompt-lookup chain of this many tokens")
    ap.add_argument("--no-check", action="store_true", help="skip the AR reference (faster)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specdemo.drafters import make_drafter
    from specdemo.engine import GenerationConfig, run_to_end
    from specdemo.prompts import load_prompts
    from specdemo.target import load_target

    target = load_target(args.model)
    prompts = load_prompts(args.prompts)[: args.limit]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    encoded = [target.encode_prompt(p["prompt"]) for p in prompts]
    refs = [None] * len(encoded) if args.no_check else [run_to_end(target, ids, None, cfg)[0] for ids in encoded]
    results = {}
    for kind in args.trees.split(","):
        opts = {"tree": kind, "budget": args.budget, "topk": args.topk, "context": args.context}
        if args.heads:
            opts["heads"] = args.heads
        new = steps = nodes = 0
        identical = 0
        tally = None
        for done, (ids, ref) in enumerate(zip(encoded, refs), 1):
            dr = make_drafter("s4c", target, **opts)
            toks, events = run_to_end(target, ids, dr, cfg)
            identical += ref is None or toks == ref
            new += len(toks)
            steps += len(events)
            nodes += sum(e.tree_size for e in events)
            tally = dr.tally if tally is None else tally + dr.tally
            print(f"  {kind}: {done}/{len(encoded)} prompts done, tau so far {new / steps:.3f} ({new}/{steps})",
                  flush=True)
        cond = [round(c, 3) for c in tally.conditional()]
        results[kind] = {"tau": round(new / steps, 3), "new_tokens": new, "steps": steps,
                         "mean_nodes": round(nodes / steps, 1), "identical": f"{identical}/{len(encoded)}",
                         "accept_depth_cond": cond}
        print(kind, json.dumps(results[kind]), flush=True)
    print(json.dumps({"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                      "budget": args.budget, "topk": args.topk, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
