"""The target's teacher-forced features of S4C's training records, computed once and kept on disk.

A store is a folder of parts (`part-00000.safetensors`, ...): each holds one fp16 tensor, the features of a few
hundred records' training windows one after another, and in its metadata where each record's rows sit.  Reading
memory-maps the parts, so a corpus of millions of tokens (several GB of features) trains without being held in RAM,
and a record costs one slice.  A part is written whole and atomically, so an interrupted extraction resumes at the
first record without features; records are keyed by a hash of their token ids, so adding a corpus shard computes only
its records.  Under `accelerate launch` the processes share out the missing records' parts.

Only a record's training window is kept: `window_of` gives the rows the trainer reads (up to `max_prompt` prompt
tokens before the answer, `max_len` rows in all), and the target reads the record only up to the window's end (the
features of a causal decoder do not depend on later tokens).  So the store's folder names its window settings.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdemo.artifacts import architecture_hash
from specdemo.target import cache_root, decoder_features

PART_RECORDS = 256  # records per part: a part is the unit of resumption and of sharing out work


def record_key(ids: list[int]) -> str:
    """The key of a record's features: a hash of its token ids."""
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:20]


def window_of(r: dict, max_prompt: int, max_len: int) -> tuple[int, int, int]:
    """(first position, length, the answer's start inside it) of a record's training window."""
    s = max(0, r["start"] - max_prompt)
    return s, min(len(r["ids"]) - s, max_len), r["start"] - s


def store_folder(target, max_prompt: int, max_len: int, layers: tuple[int, ...] = (),
                 root: str | None = None) -> Path:
    """One store per target model, dtype, set of layers and window (features are the target's, whatever the heads)."""
    key = f"{target.identity}-{architecture_hash(target.model.config)}-{str(target.dtype).split('.')[-1]}"
    key += "".join(f"-L{i}" for i in layers) + f"-w{max_prompt}x{max_len}"
    return Path(root or cache_root() / "s4c-features") / key


class FeatureStore:
    """Read side: `store.window(record)` is the (length, width) fp16 tensor of its training window's features."""

    def __init__(self, folder: str | Path, max_prompt: int, max_len: int) -> None:
        self.folder, self.max_prompt, self.max_len = Path(folder), max_prompt, max_len
        self.index: dict[str, tuple[int, int, int]] = {}  # key -> (part, first row, rows)
        self.parts: set[int] = set()
        self._files: dict[int, object] = {}
        self.refresh()

    def refresh(self) -> None:
        """Re-read the parts' indexes (after this or another process wrote parts)."""
        self._files.clear()
        for path in sorted(self.folder.glob("part-*.safetensors")):
            part = int(path.stem.split("-")[1])
            self.parts.add(part)
            with safe_open(str(path), framework="pt") as f:
                index = json.loads(f.metadata()["index"])
            self.index.update({k: (part, off, n) for k, (off, n) in index.items()})

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, r: dict) -> bool:
        return record_key(r["ids"]) in self.index

    def missing(self, records: list[dict]) -> list[dict]:
        """The records without features, each once, in their order."""
        seen, out = set(), []
        for r in records:
            key = record_key(r["ids"])
            if key not in self.index and key not in seen:
                seen.add(key)
                out.append(r)
        return out

    def window(self, r: dict) -> torch.Tensor:
        part, off, n = self.index[record_key(r["ids"])]
        if part not in self._files:
            self._files[part] = safe_open(str(self._part_path(part)), framework="pt")
        return self._files[part].get_slice("features")[off : off + n]

    def next_part(self) -> int:
        """The first free part number as of the last refresh (so that processes agree while they write)."""
        return max(self.parts, default=-1) + 1

    def _part_path(self, part: int) -> Path:
        return self.folder / f"part-{part:05d}.safetensors"

    def write_part(self, part: int, windows: list[tuple[str, torch.Tensor]]) -> None:
        """Write one part atomically: the windows' rows one after another, and where each record's rows sit."""
        index, off = {}, 0
        for key, w in windows:
            index[key] = (off, w.shape[0])
            off += w.shape[0]
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self._part_path(part).with_suffix(".tmp")
        save_file({"features": torch.cat([w for _, w in windows]).contiguous()}, str(tmp),
                  metadata={"index": json.dumps(index)})
        os.replace(tmp, self._part_path(part))


@torch.no_grad()
def _features(target, records: list[dict], max_prompt: int, max_len: int,
              layers: tuple[int, ...]) -> list[torch.Tensor]:
    """The window features of a few records in one right-padded forward, each read up to its window's end."""
    spans = [window_of(r, max_prompt, max_len) for r in records]
    lengths = [s + n for s, n, _ in spans]
    T = max(lengths)
    ids = torch.zeros(len(records), T, dtype=torch.long)
    mask = torch.zeros(len(records), T, dtype=torch.long)
    for i, (r, L) in enumerate(zip(records, lengths)):
        ids[i, :L], mask[i, :L] = torch.tensor(r["ids"][:L]), 1
    out = target.decoder(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                         output_hidden_states=bool(layers))
    return [decoder_features(out, layers, row=i)[s : s + n].to(torch.float16).cpu()
            for i, (s, n, _) in enumerate(spans)]


def extract(target, records: list[dict], store: FeatureStore, layers: tuple[int, ...] = (),
            log: Callable[[str], None] = print, batch_tokens: int = 1024, rank: int = 0, world: int = 1,
            part_records: int = PART_RECORDS) -> None:
    """Compute and store the features of the records the store lacks, in parts of `part_records` records; process
    `rank` of `world` computes every world-th part.  Every process must have read the store before any writes (the
    parts' numbers follow from it), and waits for the others before reading the new parts."""
    todo = store.missing(records)
    if not todo:
        return
    first = store.next_part()
    parts = [todo[i : i + part_records] for i in range(0, len(todo), part_records)]
    mine = [(first + j, p) for j, p in enumerate(parts) if j % world == rank]
    log(f"features: {len(records) - len(todo)} records stored, computing {len(todo)} "
        f"({sum(window_of(r, store.max_prompt, store.max_len)[1] for r in todo)} window tokens) in {len(parts)} parts "
        f"under {store.folder}")
    t0, done = time.time(), 0
    for k, (part, recs) in enumerate(mine):
        windows = []
        for batch in _token_batches(recs, store, batch_tokens):
            feats = _features(target, batch, store.max_prompt, store.max_len, layers)
            windows += [(record_key(r["ids"]), f) for r, f in zip(batch, feats)]
            done += sum(f.shape[0] for f in feats)
        store.write_part(part, windows)
        log(f"features: part {k + 1}/{len(mine)} of this process, {done / (time.time() - t0):.0f} window tok/s")
    store.refresh()


def _token_batches(records: list[dict], store: FeatureStore, batch_tokens: int) -> list[list[dict]]:
    """Records by length, grouped so that a padded batch holds about `batch_tokens` tokens."""
    ends = {id(r): sum(window_of(r, store.max_prompt, store.max_len)[:2]) for r in records}
    batches, cur = [], []
    for r in sorted(records, key=lambda r: ends[id(r)]):
        if cur and ends[id(r)] * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(r)
    return batches + ([cur] if cur else [])
