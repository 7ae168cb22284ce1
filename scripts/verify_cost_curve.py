"""Cost of one verification step (engine tree_forward + LM head + argmax) over root + n nodes, n = 0..24, relative to
n = 0 (an AR step): the curve behind the CPU tree sizes of S4C and SDSAT (docs/s4c.md, "Why 11 nodes on CPU").

    .venv/bin/python scripts/verify_cost_curve.py [--repeats 6] [--context 300]

Sizes are interleaved across repeats and the minimum is kept (a busy spell only ever adds time).  Prints two JSON
lines: relative cost and milliseconds per n.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specdemo.verify import prefilled_cache, trial_forward
from specdemo.target import load_target
from specdemo.tree import DraftTree


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--max-nodes", type=int, default=24)
    args = ap.parse_args(argv)
    t = load_target(args.model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 30000, (args.context + args.max_nodes + 1,), generator=g).tolist()
    with torch.no_grad():
        cache = prefilled_cache(t, ids[: args.context - 1], args.max_nodes + 8)
        times: dict[int, list[float]] = {n: [] for n in range(args.max_nodes + 1)}
        for rep in range(args.repeats + 1):  # the first pass warms up and is not counted
            for n in times:
                # two chains plus siblings, the shape of the trained drafters' trees
                tree = DraftTree(ids[args.context : args.context + n], [-1 if i < 2 else i - 2 for i in range(n)])
                t0 = time.perf_counter()
                logits, _ = trial_forward(t, cache, ids[args.context - 1], tree)
                logits.argmax(-1).tolist()
                t.sync()
                if rep:
                    times[n].append(1e3 * (time.perf_counter() - t0))
    base = min(times[0])
    print(json.dumps({n: round(min(v) / base, 2) for n, v in times.items()}))
    print(json.dumps({n: round(min(v), 1) for n, v in times.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
