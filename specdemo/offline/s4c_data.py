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
from specdemo.target import cache_root


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
def extract_features(target, records: list[dict], cache_file: Path, max_prompt: int, log=print) -> dict[str, torch.Tensor]:
    """Teacher-forced target features (fp16) of every record, one target forward per record, cached on disk."""
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
        h = target.decoder(input_ids=ids).last_hidden_state[0]
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
    """The ids the heads score, sorted: the `always` ids (EOS, special tokens) and the records' most frequent tokens,
    `size` in all (only tokens that occur, when at least 16 do)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        counts.index_add_(0, torch.tensor(r["ids"]), torch.ones(len(r["ids"]), dtype=torch.long))
    counts[torch.tensor([t for t in always if 0 <= t < vocab_size], dtype=torch.long)] += 10 ** 9
    k = min(size, vocab_size)
    top = torch.topk(counts, k).indices
    top = top[counts[top] > 0] if (counts > 0).sum() >= 16 else top
    return torch.sort(top).values


def feature_cache(target, folder: str | None = None) -> Path:
    """One feature file per target model and dtype (features are the target's, whatever the heads)."""
    key = f"{target.identity}-{architecture_hash(target.model.config)}-{str(target.dtype).split('.')[-1]}"
    return Path(folder or cache_root() / "s4c-features") / f"{key}.pt"
