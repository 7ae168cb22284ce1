"""Retrieval latency of the REST datastore per decoding step, on a ~20M-token store.

    .venv/bin/python scripts/rest_latency.py [--tokens 20e6] [--queries 2000]

The store is the default datastore's documents repeated until it holds --tokens tokens (built once under
runs/rest_latency/); queries are the real decoding contexts of the cached HumanEval AR outputs of scripts/rest_tau.py
(or random windows of the store when there are none).  Reports the median / p90 of: the longest-suffix match alone,
match + reading up to 5000 continuations (= REST's retrieval), and the drafter's whole propose() (store + request
retrieval, trie, subtree).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=20e6)
    ap.add_argument("--queries", type=int, default=2000)
    args = ap.parse_args(argv)

    from specdemo.drafters.rest.drafter import RestDrafter
    from specdemo.engine import DecodeState
    from specdemo.offline import build_datastore as D
    from specdemo.sampling import SamplingConfig
    from specdemo.target import load_target

    target = load_target()
    base = D.Datastore(D.ensure_default(target), target=target)
    out = ROOT / "runs" / "rest_latency" / f"store-{int(args.tokens / 1e6)}M"
    if not (out / "manifest.json").exists():
        t = base.tokens
        cuts = np.flatnonzero(t == base.sep)
        docs = [t[a + 1 : b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a + 1]
        reps = int(np.ceil(args.tokens / len(base)))
        print(f"building a {reps}x copy of the default store ({reps * len(base) / 1e6:.1f}M tokens) ...", flush=True)
        D.build(out, target.tokenizer, token_docs=(d for _ in range(reps) for d in docs), progress=True,
                sources=[f"{reps} x {base.path}"])
    store = D.Datastore(out, target=target, verify=False)
    print(f"store: {len(store) / 1e6:.1f}M tokens, {len(store.sa) / 1e6:.1f}M entries")

    contexts = []
    for f in sorted((ROOT / "runs" / "rest_tau").glob("ar-humaneval-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            seq = r["prompt_ids"] + r["output"]
            contexts += [seq[:k] for k in range(len(r["prompt_ids"]), len(seq))]
    rng = np.random.default_rng(0)
    if not contexts:
        ends = rng.integers(100, len(store.tokens) - 1, args.queries)
        contexts = [[int(x) for x in store.tokens[e - 64 : e] if x != store.sep] for e in ends]
    idx = rng.choice(len(contexts), min(args.queries, len(contexts)), replace=False)
    contexts = [contexts[i] for i in idx]

    drafter = RestDrafter(store=store, budget=16)
    t_match, t_retr, t_prop, lengths = [], [], [], []
    for ctx in contexts:
        t0 = time.perf_counter()
        m, lo, hi = store.match(ctx, 16, 2)
        t1 = time.perf_counter()
        if m:
            store.continuations(lo, hi, 5000, 10)
        t2 = time.perf_counter()
        drafter.propose(DecodeState(ctx, max(1, len(ctx) - 64), 10**6, SamplingConfig(), target))
        t3 = time.perf_counter()
        t_match.append(t1 - t0)
        t_retr.append(t2 - t0)
        t_prop.append(t3 - t2)
        lengths.append(m)

    def ms(xs, q):
        return 1e3 * float(np.quantile(xs, q))

    print(f"{len(contexts)} queries; match length median {statistics.median(lengths)}, "
          f"share with a match {np.mean(np.array(lengths) > 0):.0%}")
    for name, xs in (("match", t_match), ("retrieval (match + 5000 continuations)", t_retr),
                     ("propose (store + request + trie)", t_prop)):
        print(f"  {name:40s} median {ms(xs, 0.5):.3f} ms   p90 {ms(xs, 0.9):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
