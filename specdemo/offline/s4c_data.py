"""S4C's training data: records with the position where their answer starts, batches of them with the target's
teacher-forced features (kept on disk by feature_store.py), and the draft vocabulary the heads score.  The trainer
(train_s4c.py) drives them.
"""
from __future__ import annotations

import torch

from specdemo.offline import corpus
from specdemo.offline.feature_store import FeatureStore, window_of


def read_records(paths: list[str], first: list[int] | None = None) -> list[dict]:
    """Records {"id", "ids", "start"} (start = first answer position) for the unrolled training.  `first` takes the
    first N records of each file (one number per file, or one for all; 0 = all): a fine-tune mixes a new corpus with a
    replay slice of the old ones without computing features for all of them."""
    first = list(first or [0])
    if len(first) not in (1, len(paths)):
        raise ValueError(f"--first takes one number or one per --data file ({len(paths)}), not {len(first)}")
    limits = first * len(paths) if len(first) == 1 else first
    recs = [r for path, n in zip(paths, limits) for r in corpus.read_records([path])[: n or None]]
    return [{"id": r["id"], "ids": r["prompt_ids"] + r["answer_ids"], "start": len(r["prompt_ids"])}
            for r in recs if len(r["answer_ids"]) >= 4]


def build_draft_vocab(records: list[dict], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The ids the heads score, sorted: the `always` ids (EOS, special tokens) and the most frequent tokens of the
    records' answers (`ids` from `start` on), `size` in all (only tokens that occur, when at least 16 do).  Answers
    only: the heads draft answer tokens, and the drafter adds every token of the request itself at run time."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        ids = r["ids"][r.get("start", 0):]
        counts.index_add_(0, torch.tensor(ids, dtype=torch.long), torch.ones(len(ids), dtype=torch.long))
    counts[torch.tensor([t for t in always if 0 <= t < vocab_size], dtype=torch.long)] += 10 ** 9
    k = min(size, vocab_size)
    top = torch.topk(counts, k).indices
    top = top[counts[top] > 0] if (counts > 0).sum() >= 16 else top
    return torch.sort(top).values


def valid_counts(lens: torch.Tensor, starts: torch.Tensor, n_heads: int) -> list[int]:
    """Per head, the positions of a batch that carry a loss (see `unrolled_losses`'s `valid`): head h (k = h + 1)
    predicts answer tokens k + 1 .. len - 1 positions ahead of the sequence start."""
    return [int((lens - torch.maximum(starts, torch.full_like(starts, h + 2))).clamp_min(0).sum())
            for h in range(n_heads)]


def batch_counts(batch: list[dict], max_prompt: int, max_len: int, n_heads: int) -> list[int]:
    """`valid_counts` of a whole (global) batch, from the records alone."""
    lens, starts = zip(*[window_of(r, max_prompt, max_len)[1:] for r in batch])
    return valid_counts(torch.tensor(lens), torch.tensor(starts), n_heads)


def collate(batch: list[dict], feats: FeatureStore, dtype, dev):
    """A right-padded batch: ids (B, T), their features (B, T, width), lengths and answer starts."""
    crops = [window_of(r, feats.max_prompt, feats.max_len) for r in batch]
    windows = [feats.window(r) for r in batch]
    T, d = max(n for _, n, _ in crops), windows[0].shape[-1]
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    ft = torch.zeros(len(batch), T, d, dtype=dtype)
    for i, (r, (s, n, _)) in enumerate(zip(batch, crops)):
        ids[i, :n] = torch.tensor(r["ids"][s : s + n])
        ft[i, :n] = windows[i].to(dtype)
    lens, starts = (torch.tensor(x) for x in list(zip(*crops))[1:])
    return ids.to(dev), ft.to(dev), lens.to(dev), starts.to(dev)
