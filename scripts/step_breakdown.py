"""Where one AR step's time goes at each CPU precision: the decoder's linears, the LM head, and everything else
(attention, norms, rotary embeddings, residuals, casts, Python).

    python scripts/step_breakdown.py [--precisions fp32,bf16,int4] [--context 256] [--repeats 20]

The whole step is `verify.trial_forward` with no draft (a one-token verification after `context` tokens, the LM head
included); the linears and the head are the products the step runs (the CPU step's fused ones where the model has it,
step_decoder.py; SPECDEMO_FUSED_DECODER=0 for the transformers decoder's) fed the step's shapes in a loop (one row each,
in the order a step calls them), so "the rest" is the step minus both.  Fastest of `repeats`, alone on the machine.
"""
from __future__ import annotations

import argparse
import time

import torch

from specdemo.verify import prefilled_cache, trial_forward
from specdemo.precision import Int4Linear
from specdemo.target import load_target
from specdemo.tree import DraftTree


def fastest(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()  # the mode generate runs in
def breakdown(precision: str, context: int, repeats: int) -> dict[str, float]:
    target = load_target("embedded", precision=precision)
    ids = torch.randint(100, 30000, (context + 1,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = prefilled_cache(target, ids[:context], 4)
    step = fastest(lambda: trial_forward(target, cache, ids[context], DraftTree.empty()), repeats)
    head = target.lm_head
    if target.step_decoder is not None:  # the products the CPU step runs (q/k/v and gate/up fused)
        linears = target.step_decoder.products
    else:
        linears = [(m, m.in_features) for m in target.decoder.modules() if isinstance(m, (torch.nn.Linear, Int4Linear))]
    inputs = {width: torch.randn(1, 1, width) for _, width in linears}
    lin = fastest(lambda: [m(inputs[width]) for m, width in linears], repeats)
    x = torch.randn(1, 1, head.in_features)
    head_s = fastest(lambda: head(x), repeats)
    return {"step": step, "linears": lin, "lm_head": head_s, "rest": step - lin - head_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precisions", default="fp32,bf16,int4")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    print(f"| precision | AR step ms | decoder linears | LM head | the rest | ({torch.get_num_threads()} threads, "
          f"context {args.context})")
    print("|---|---|---|---|---|")
    for prec in args.precisions.split(","):
        r = {k: 1e3 * v for k, v in breakdown(prec, args.context, args.repeats).items()}
        print(f"| {prec} | {r['step']:.1f} | {r['linears']:.1f} | {r['lm_head']:.1f} | {r['rest']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
