"""Cost of one verification step (the tree forward + LM head + argmax) over root + n nodes, relative to n = 0 (an AR
step): the curve behind the tree sizes per device (docs/s4c.md, "Why 11 nodes on CPU"; docs/dynamic-trees.md).

    python scripts/verify_cost_curve.py [--repeats 6] [--context 300] [--sizes 0-24]
    python scripts/verify_cost_curve.py --random llama-8b --device cuda --dtype bfloat16 --sizes 0,1,2,4,8,16,32,64,128

`--random` builds a Llama-style model of that shape from its config alone, weights drawn at random on the device (no
download): cost depends on the shapes, not the weights, so a GPU's curve for a 1B or 8B target can be read without
the checkpoint.  Verifications run the way runs on the device run them (static steps replayed as CUDA graphs on a GPU,
the plain forward on a CPU).  Sizes are interleaved across repeats and the minimum is kept (a busy spell only ever adds
time).
Prints one JSON line: {"model", "device", "dtype", "ms": {n: ms}, "relative": {n: cost / cost at 0}}.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specdemo.budget import trial_cache
from specdemo.cuda_graphs import GraphedSteps
from specdemo.target import Target, load_target
from specdemo.tree import DraftTree
from specdemo.verify import trial_forward

# Llama-3.2-1B's and Llama-3.1-8B's shapes; "tiny" keeps the script testable on a CPU
RANDOM_SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256),
}


def random_target(shape: str, device: str, dtype: torch.dtype) -> Target:
    """A Llama-style model of a named shape with random weights, made on `device` in `dtype` (no tokenizer: the
    cost curve needs token ids only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**RANDOM_SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=shape == "tiny")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return Target(f"random {shape}", model, None, torch.device(device), dtype, set(), 4096, f"random-{shape}")


def parse_sizes(text: str) -> list[int]:
    """"0-24" or "0,1,2,4,8" (0 is always measured: the AR step the others are relative to)."""
    if "-" in text and "," not in text:
        lo, hi = map(int, text.split("-"))
        return sorted({0, *range(lo, hi + 1)})
    return sorted({0, *map(int, text.split(","))})


@torch.inference_mode()  # the mode generate runs in
def cost_curve(t: Target, sizes: list[int], repeats: int, context: int) -> tuple[dict[int, float], str]:
    """Fastest milliseconds of a verification over root + n nodes, for each n in `sizes`, and how the verifications
    ran: "cuda graphs", "static" (padded buckets, eager) or "plain"."""
    g = torch.Generator().manual_seed(0)
    vocab = min(t.model.config.vocab_size, 30000)
    ids = torch.randint(100 % vocab, vocab, (context + max(sizes) + 1,), generator=g).tolist()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    # verified the way this device's runs verify: static steps replayed as CUDA graphs on a GPU, else the plain path
    with t.lock, trial_cache(t, ids[: context - 1], max(sizes)) as (cache, steps):
        for rep in range(repeats + 1):  # the first pass warms up (and captures the graphs) and is not counted
            for n in sizes:
                # two chains plus siblings, the shape of the trained drafters' trees
                tree = DraftTree(ids[context : context + n], [-1 if i < 2 else i - 2 for i in range(n)])
                t0 = time.perf_counter()
                logits, _ = trial_forward(t, cache, ids[context - 1], tree, steps)
                logits.argmax(-1).tolist()
                t.sync()
                if rep:
                    times[n].append(1e3 * (time.perf_counter() - t0))
    kind = "plain" if steps is None else "cuda graphs" if isinstance(steps, GraphedSteps) else "static"
    return {n: min(v) for n, v in times.items()}, kind


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--random", choices=sorted(RANDOM_SHAPES), help="a random-weight Llama of this shape instead")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the loader's choice)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--sizes", default="0-24")
    args = ap.parse_args(argv)
    if args.random:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        t = random_target(args.random, device, getattr(torch, args.dtype or "bfloat16"))
    else:
        t = load_target(args.model, args.device, args.dtype)
    ms, kind = cost_curve(t, parse_sizes(args.sizes), args.repeats, args.context)
    print(json.dumps({"model": t.name, "device": torch.cuda.get_device_name(t.device) if t.device.type == "cuda"
                      else "cpu", "dtype": str(t.dtype).removeprefix("torch."), "steps": kind,
                      "ms": {n: round(v, 3) for n, v in ms.items()},
                      "relative": {n: round(v / ms[0], 3) for n, v in ms.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
