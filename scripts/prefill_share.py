"""How much of int4 AR's time on a prompt set is the prompts' prefill, beside transformers' `generate` (fp32) and our
int4 AR on the same prompts: the numbers behind docs/precision.md, "How far int4 AR can go on two cores".

    python scripts/prefill_share.py [--prompts spec_bench] [--per-group 12] [--max-new-tokens 64]

Prefill: each prompt's prefill alone (int4's bf16 prefill weights, fastest of 2); hf and AR: one run each per prompt,
alternating, through the bench's own `run_one`.  Prints one JSON line.  Alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specdemo.bench import run_one, select_prompts
from specdemo.prompts import load_prompts
from specdemo.sampling import SamplingConfig
from specdemo.target import Target, load_target
from specdemo.kvcache import KVCache


@torch.inference_mode()  # the mode generate runs in
def prefill_seconds(target: Target, ids: list[int], repeats: int = 2) -> float:
    """Fastest of `repeats` prefills of everything but the root, as the engine prefills a prompt."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        target.prefill(torch.tensor([ids[:-1]], device=target.device),
                       KVCache(capacity=len(ids) + 8, layers=target.n_layers))
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="spec_bench")
    ap.add_argument("--per-group", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    target = load_target("embedded", precision="int4")
    prompts = select_prompts(load_prompts(args.prompts), args.prompts, None, args.per_group)
    encoded = [target.encode_prompt(p["prompt"]) for p in prompts]
    prefill_seconds(target, encoded[0])
    prefill = sum(prefill_seconds(target, ids) for ids in encoded)
    greedy = SamplingConfig()
    for method in ("hf", "ar"):  # warm-up, as the bench does
        run_one(target, method, encoded[0], 16, greedy)
    wall = {"hf": 0.0, "ar": 0.0}
    for ids in encoded:
        for method in wall:
            wall[method] += run_one(target, method, ids, args.max_new_tokens, greedy)["wall_time"]
    tokens = len(encoded) * args.max_new_tokens
    print(json.dumps({"prompts": len(encoded), "prompt_tokens": sum(map(len, encoded)), "new_tokens": tokens,
                      "prefill_s": round(prefill, 2), "hf_s": round(wall["hf"], 2), "int4_ar_s": round(wall["ar"], 2),
                      "hf_tok_s": round(tokens / wall["hf"], 2), "int4_ar_tok_s": round(tokens / wall["ar"], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
