"""S4C's training data: records with the position where their answer starts, the target's teacher-forced features
of every record (one forward each, cached on disk, so a resumed or repeated run skips them), and the draft vocabulary
the heads score.  The trainer (train_s4c.py) batches them.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from specdemo.artifacts import architecture_hash
from specdemo.offline import corpus
from specdemo.target import cache_root, decoder_features


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


def record_key(ids: list[int]) -> str:
    """The key of a record's features in the cache: a hash of its token ids."""
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:20]


@torch.no_grad()
def extract_features(target, records: list[dict], cache_file: Path, max_prompt: int, log=print,
                     layers: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """Teacher-forced target features (fp16) of every record, one target forward per record, cached on disk: the
    last hidden states, with `layers` those layers' states beside them (target.decoder_features)."""
    feats: dict[str, torch.Tensor] = {}
    if cache_file.exists():
        try:
            feats = torch.load(cache_file)
        except Exception:
            feats = {}
    todo = [r for r in records if record_key(r["ids"]) not in feats]
    if todo:
        log(f"features: {len(records) - len(todo)} cached, computing {len(todo)} "
            f"({sum(len(r['ids']) for r in todo)} tokens) ...")
    t0, done_tok, last_save = time.time(), 0, time.time()
    for i, r in enumerate(todo):
        ids = torch.tensor([r["ids"]], device=target.device)
        h = decoder_features(target.decoder(input_ids=ids, output_hidden_states=bool(layers)), layers)
        feats[record_key(r["ids"])] = h.to(torch.float16).cpu()
        done_tok += len(r["ids"])
        if time.time() - last_save > 120 or i == len(todo) - 1:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(feats, str(cache_file) + ".tmp")
            os.replace(str(cache_file) + ".tmp", cache_file)
            last_save = time.time()
            log(f"features: {i + 1}/{len(todo)} records, {done_tok / (time.time() - t0):.0f} tok/s")
    return feats


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


def feature_cache(target, folder: str | None = None, layers: tuple[int, ...] = ()) -> Path:
    """One feature file per target model, dtype and set of layers (features are the target's, whatever the heads)."""
    key = f"{target.identity}-{architecture_hash(target.model.config)}-{str(target.dtype).split('.')[-1]}"
    key += "".join(f"-L{i}" for i in layers)
    return Path(folder or cache_root() / "s4c-features") / f"{key}.pt"


def valid_counts(lens: torch.Tensor, starts: torch.Tensor, n_heads: int) -> list[int]:
    """Per head, the positions of a batch that carry a loss (see `unrolled_losses`'s `valid`): head h (k = h + 1)
    predicts answer tokens k + 1 .. len - 1 positions ahead of the sequence start."""
    return [int((lens - torch.maximum(starts, torch.full_like(starts, h + 2))).clamp_min(0).sum())
            for h in range(n_heads)]


def _crop(r: dict, max_prompt: int, max_len: int) -> tuple[int, int, int]:
    """Where a record's training window starts in its ids, its length and its answer's start inside it."""
    s = max(0, r["start"] - max_prompt)
    return s, min(len(r["ids"]) - s, max_len), r["start"] - s


def batch_counts(batch: list[dict], max_prompt: int, max_len: int, n_heads: int) -> list[int]:
    """`valid_counts` of a whole (global) batch, from the records alone."""
    lens, starts = zip(*[_crop(r, max_prompt, max_len)[1:] for r in batch])
    return valid_counts(torch.tensor(lens), torch.tensor(starts), n_heads)


def collate(batch: list[dict], feats: dict, max_prompt: int, max_len: int, dtype, dev):
    crops = [_crop(r, max_prompt, max_len) for r in batch]
    T, d = max(n for _, n, _ in crops), feats[record_key(batch[0]["ids"])].shape[-1]
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    ft = torch.zeros(len(batch), T, d, dtype=dtype)
    for i, (r, (s, n, _)) in enumerate(zip(batch, crops)):
        ids[i, :n] = torch.tensor(r["ids"][s : s + n])
        ft[i, :n] = feats[record_key(r["ids"])][s : s + n].to(dtype)
    lens, starts = (torch.tensor(x) for x in list(zip(*crops))[1:])
    return ids.to(dev), ft.to(dev), lens.to(dev), starts.to(dev)
