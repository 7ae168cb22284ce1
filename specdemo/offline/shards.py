"""A distilled corpus in numbered shards: a fixed manifest of which prompts each shard answers, shards shared out over
processes, and the glob that trainers and the datastore read.

    python -m specdemo distill --prompts sharegpt --first 1000000 --later 1000000 --every-later --heldout 0 \\
        --skip assets/corpus/sharegpt_distill.jsonl.gz --out assets/corpus/sharegpt/
    accelerate launch --multi_gpu --num_processes 2 -m specdemo distill ... --out assets/corpus/sharegpt/  # same shards

The first run writes `manifest.json`: the ids of each shard's prompts (`shard_prompts` each, prompts longer than
`max_prompt_tokens` left out, ids already in a `--skip` corpus left out).  Every later run, on any number of processes,
reads that manifest rather than recomputing it, so a shard always answers the same prompts: shard k goes to process
k mod world, and each shard is answered exactly as a single process answers it (its own longest-first batches).  A
shard is a normal distilled corpus (`shard-007.jsonl.gz`, header with the command) with its own journal, so an
interrupted run resumes shard by shard; a finished shard has no journal and can be committed.
"""
from __future__ import annotations

import json
from pathlib import Path

from specdemo.offline.corpus import expand, journal_path, read_corpus

MANIFEST = "manifest.json"


def shard_path(out_dir: Path, k: int) -> Path:
    return out_dir / f"shard-{k:03d}.jsonl.gz"


def finished(path: Path, ids: list[str]) -> bool:
    """The shard holds (or dropped) every prompt of its manifest entry and has no journal: it can be committed."""
    if not path.exists() or journal_path(path).exists():
        return False
    header, records = read_corpus(path)
    return set(ids) <= {r["id"] for r in records} | set((header or {}).get("dropped", []))


def skip_ids(paths: list[str]) -> set[str]:
    """Ids answered (or dropped) in the corpora of `paths`: a new sharded corpus does not answer them again."""
    ids: set[str] = set()
    for path in expand(paths):
        header, records = read_corpus(path)
        ids |= {r["id"] for r in records} | set((header or {}).get("dropped", []))
    return ids


def make_manifest(target, specs: list[dict], skip: set[str], shard_prompts: int, max_prompt_tokens: int,
                  command: str) -> dict:
    """The shards' prompt ids: `specs` in order, less `skip` and the prompts over `max_prompt_tokens`."""
    keep = [s["id"] for s in specs
            if s["id"] not in skip and len(target.encode_chat(s["messages"])) <= max_prompt_tokens]
    return {"shard_prompts": shard_prompts, "max_prompt_tokens": max_prompt_tokens, "command": command,
            "tokenizer": target.identity,
            "shards": [keep[i: i + shard_prompts] for i in range(0, len(keep), shard_prompts)]}


def load_or_make_manifest(out_dir: Path, make, is_main: bool, wait) -> dict:
    """The directory's manifest; the main process writes it on first use while the others wait."""
    path = out_dir / MANIFEST
    if not path.exists() and is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(MANIFEST + ".tmp")
        tmp.write_text(json.dumps(make()))
        tmp.replace(path)
    wait()
    return json.loads(path.read_text())


def my_shards(manifest: dict, rank: int, world: int, limit: int = 0) -> list[int]:
    """The shards this process answers: k mod world == rank, among the first `limit` (0: all)."""
    n = len(manifest["shards"]) if not limit else min(limit, len(manifest["shards"]))
    return [k for k in range(n) if k % world == rank]
