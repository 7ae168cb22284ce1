"""Smaller S4C heads cut from trained ones, to price a head shape's drafting before training heads of that shape.

Keeps each head's `--intermediate-size` MLP channels of largest |gate| * |up| * |down| (weight norms) and the
`--draft-vocab` tokens of the heads' vocabulary most frequent in `--corpora`'s answers; nothing is retrained, so the
cut heads' acceptance is only a floor for heads trained at that shape.  Their drafting cost per step is what the
shape costs: with fixed trees (`dynamic=false`) every step runs every head on the same rows whatever the heads
predict.

    python scripts/head_shape_cost.py --intermediate-size 384 --draft-vocab 2048 --out runs/heads_i384_v2048
    python -m specdemo bench --prompts docs/cpu/tune12_prompts.jsonl --limit 12 --max-new-tokens 64 --precision fp32 \\
        --methods ar,s4c:fix,s4c:cut --option s4c:fix.dynamic=false --option s4c:cut.dynamic=false \\
        --option s4c:cut.heads=runs/heads_i384_v2048
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdemo.drafters.s4c.heads import EMBEDDED_HEADS, S4CHeads, load_heads, save_heads
from specdemo.offline.corpus import answer_counts
from specdemo.target import load_target


def channel_order(layer) -> torch.Tensor:
    """The MLP's intermediate channels, most important first (the product of the three weights' norms per channel)."""
    mlp = layer.mlp
    score = mlp.gate_proj.weight.norm(dim=1) * mlp.up_proj.weight.norm(dim=1) * mlp.down_proj.weight.norm(dim=0)
    return score.argsort(descending=True)


def frequent_vocab(vocab: torch.Tensor, corpora: list[str], n: int) -> torch.Tensor:
    """The `n` tokens of `vocab` most frequent in the corpora's answers, in id order."""
    counts = answer_counts(corpora)
    ranked = sorted(vocab.tolist(), key=lambda t: -counts.get(t, 0))
    return torch.tensor(sorted(ranked[:n]))


def cut_heads(heads: S4CHeads, intermediate: int, vocab: torch.Tensor) -> S4CHeads:
    small = S4CHeads(heads.target, heads.n_heads, intermediate, vocab, heads.feature_layers)
    state = {k: v for k, v in heads.state_dict().items() if k != "draft_vocab"}
    for h, layer in enumerate(heads.layers):
        keep = channel_order(layer)[:intermediate].sort().values
        prefix = f"layers.{h}.mlp."
        state[prefix + "gate_proj.weight"] = state[prefix + "gate_proj.weight"][keep]
        state[prefix + "up_proj.weight"] = state[prefix + "up_proj.weight"][keep]
        state[prefix + "down_proj.weight"] = state[prefix + "down_proj.weight"][:, keep]
    small.load_state_dict(state, strict=False)
    return small


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default=str(EMBEDDED_HEADS))
    ap.add_argument("--intermediate-size", type=int, required=True)
    ap.add_argument("--draft-vocab", type=int, required=True)
    ap.add_argument("--corpora", nargs="+", default=["assets/corpus/sharegpt/shard-00[0-3].jsonl.gz"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = load_target("embedded", precision="fp32")
    heads = load_heads(target, args.heads).float()
    vocab = frequent_vocab(heads.draft_vocab, args.corpora, args.draft_vocab)
    small = cut_heads(heads, args.intermediate_size, vocab)
    save_heads(small, Path(args.out), {"cut_from": args.heads, "training": heads.config.get("training", {})})
    print(f"{args.out}: {args.intermediate_size} MLP channels, {len(vocab)} draft tokens")


if __name__ == "__main__":
    main()
