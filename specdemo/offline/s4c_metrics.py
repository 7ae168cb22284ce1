"""Hit counts of S4C heads against the target's choices, summed over batches and turned into the held-out and running
numbers `train s4c` logs (top-1, top-k, chains of right heads, with and without the draft vocabulary's limit)."""
from __future__ import annotations

import torch


def hits(logits: torch.Tensor, lab: torch.Tensor, valid: torch.Tensor, prev_ok: torch.Tensor | None, topk: int):
    """One head's hit counts over its valid positions (top-1, top-k, and the chain: this head and every earlier one
    right at the position), and the chain mask the next head extends."""
    top = logits.topk(topk, -1).indices
    hit1 = top[:, 0] == lab
    ok = torch.zeros_like(valid)
    ok[valid] = hit1  # `valid.nonzero()` is the order the rows were gathered in
    chain = ok if prev_ok is None else ok & prev_ok
    cond_den = valid if prev_ok is None else valid & prev_ok
    return dict(n=int(valid.sum()), top1=int(hit1.sum()), topk=int((top == lab.unsqueeze(1)).any(-1).sum()),
                chain=int((chain & valid).sum()), cond_n=int(cond_den.sum()),
                cond_hit=int((chain & cond_den).sum())), chain


def hits_full(hit: torch.Tensor, valid: torch.Tensor, prev_ok: torch.Tensor | None):
    """`hits`'s top-1 and chain counts against the target's choice over its whole vocabulary."""
    ok = torch.zeros_like(valid)
    ok[valid] = hit
    chain = ok if prev_ok is None else ok & prev_ok
    return dict(top1_full=int(hit.sum()), chain_full=int((chain & valid).sum())), chain


def sum_metrics(acc: list, ms: list) -> list:
    if not acc:
        acc = [dict() for _ in ms]
    for a, m in zip(acc, ms):
        if m:
            for k, v in m.items():
                a[k] = a.get(k, 0) + v * (m["n"] if k in ("ce", "soft", "l1") else 1)
    return acc


def format_metrics(acc: list) -> dict:
    out = {}
    for h, a in enumerate(acc, 1):
        if not a.get("n"):
            continue
        out[f"head{h}"] = dict(top1=round(a["top1"] / a["n"], 4), top3=round(a["topk"] / a["n"], 4),
                               chain=round(a["chain"] / a["n"], 4),
                               cond=round(a["cond_hit"] / max(1, a["cond_n"]), 4),
                               soft_ce=round(a["soft"] / a["n"], 4), l1=round(a["l1"] / a["n"], 4), n=a["n"])
        if "top1_full" in a:
            out[f"head{h}"].update(top1_full=round(a["top1_full"] / a["n"], 4),
                                   chain_full=round(a["chain_full"] / a["n"], 4))
    return out
