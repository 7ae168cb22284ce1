"""SDSAT's training rows: adaptive chains hung after sampled positions of a clean sequence, their attention mask, and
their logits (with the original model's own next-token distributions as soft labels) from one clean forward plus one
forward of the chains.  The trainer (train_sdsat.py) draws and optimises them.
"""
from __future__ import annotations

import random

import torch

from specdemo.drafters.sdsat.adapter import SDSATAdapter


def build_probes(seq: list[int], start: int, L: int, rate: float, rng: random.Random | None, max_probes: int,
                 token_id: int):
    """Adaptive chains for one clean sequence.

    Origins p in [start-1, len-3] (p = the last context token; start = prompt length) are picked with probability
    `rate` (every one when rng is None); the chain at p holds min(L, len-2-p) adaptive tokens at positions p+1.., and
    token j (1-based) is labelled x_{p+j+1}.  Returns (ids, positions, labels, depths, origins, ctx_len) with the
    chain rows in order, or None when there is nothing to train on.
    """
    n = len(seq)
    cand = list(range(max(0, start - 1), n - 2))
    if rng is not None:
        cand = [p for p in cand if rng.random() < rate]
    chains, total = [], 0
    for p in cand:
        m = min(L, n - 2 - p)
        if m <= 0:
            continue
        if total + m > max_probes:
            break
        chains.append((p, m))
        total += m
    if not chains:
        return None
    pos, lab, dep, org = [], [], [], []
    for p, m in chains:
        for j in range(1, m + 1):
            pos.append(p + j)
            lab.append(seq[p + j + 1])
            dep.append(j)
            org.append(p)
    ctx_len = max(p for p, _ in chains) + 1
    return ([token_id] * total, torch.tensor(pos), torch.tensor(lab), torch.tensor(dep), torch.tensor(org), ctx_len)


def probe_mask(positions: torch.Tensor, origins: torch.Tensor, ctx_len: int, dtype) -> torch.Tensor:
    """Additive (1, 1, N, ctx_len + N) mask: a chain row sees x_0..x_p and its own chain up to itself."""
    n = len(positions)
    allow_ctx = torch.arange(ctx_len)[None, :] <= origins[:, None]
    idx = torch.arange(n)
    allow_probe = (origins[:, None] == origins[None, :]) & (idx[None, :] <= idx[:, None])
    allow = torch.cat([allow_ctx, allow_probe], dim=1)
    mask = torch.zeros(1, 1, n, ctx_len + n, dtype=dtype)
    return mask.masked_fill_(~allow, torch.finfo(dtype).min)


def probe_logits(model, adapter: SDSATAdapter, seq: list[int], batch, grad: bool) -> torch.Tensor:
    """Logits (N, V) of the adaptive chains of `batch` (from build_probes) on clean sequence `seq`."""
    return probe_logits_and_targets(model, adapter, seq, batch, grad, soft=False)[0]


def probe_logits_and_targets(model, adapter: SDSATAdapter, seq: list[int], batch, grad: bool,
                             soft: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`probe_logits`, and with `soft` the original model's next-token distribution (N, V) for every chain row's
    label: the clean forward's at the label's position (row j of the chain at p: position p + j), read from the
    same clean forward (then run up to the last such position; the chains' mask hides the extra context)."""
    return probe_logits_many(model, adapter, [seq], [batch], grad, soft)[0]


def probe_logits_many(model, adapter: SDSATAdapter, seqs: list[list[int]], batches: list, grad: bool,
                      soft: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """`probe_logits_and_targets` for several clean sequences in two forwards (a clean one without gradient, then one
    of every sequence's chains): one sequence per batch row, the clean contexts padded on the right (a causal model's
    real positions never see the padding) and the chains padded with rows that see only themselves.  On a GPU this is
    what keeps the trainer from launching two small forwards per sequence; the logits equal the one-sequence calls'
    to float round-off."""
    from transformers import DynamicCache

    decoder, head = model.get_decoder(), model.get_output_embeddings()
    dev, dtype = adapter.embedding.device, adapter.embedding.dtype
    ctxs = [int(b[1].max()) + 1 if soft else b[5] for b in batches]
    counts = [len(b[0]) for b in batches]
    c, n = max(ctxs), max(counts)
    clean_ids = torch.zeros(len(seqs), c, dtype=torch.long)
    for i, (seq, ctx) in enumerate(zip(seqs, ctxs)):
        clean_ids[i, :ctx] = torch.tensor(seq[:ctx])
    ids = torch.full((len(seqs), n), adapter.token_id, dtype=torch.long)
    pos = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.full((len(seqs), 1, n, c + n), torch.finfo(dtype).min, dtype=dtype)
    mask[:, 0, :, c:] = torch.eye(n, dtype=dtype).sub_(1).mul_(-torch.finfo(dtype).min)  # padding rows: themselves
    for i, (b, ctx, k) in enumerate(zip(batches, ctxs, counts)):
        pos[i, :k] = b[1]
        rows = probe_mask(b[1], b[4], ctx, dtype)[0, 0]
        mask[i, 0, :k, :ctx], mask[i, 0, :k, c : c + k] = rows[:, :ctx], rows[:, ctx:]
    cache = DynamicCache()
    with torch.no_grad():  # the frozen original model over the clean contexts (adapter off)
        clean = decoder(input_ids=clean_ids.to(dev), past_key_values=cache, use_cache=True).last_hidden_state
        targets = [head(clean[i, b[1].to(dev)]).float().softmax(-1) if soft else None for i, b in enumerate(batches)]
    with torch.set_grad_enabled(grad), adapter.active(None):
        h = decoder(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                    past_key_values=cache, use_cache=True).last_hidden_state
        logits = head(torch.cat([h[i, :k] for i, k in enumerate(counts)])).split(counts)
    return list(zip(logits, targets))
