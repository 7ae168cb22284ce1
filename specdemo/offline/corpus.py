"""The training corpora: where they live and the one reader every trainer and the datastore builder use.

A distilled corpus (`python -m specdemo distill`) is gzip JSONL: a header line, then records {"id", "prompt_ids",
"answer_ids", ...}.  Held-out records are chosen by `sharegpt.is_heldout_record` (one split for every consumer), so
S4C's and SDSAT's held-out figures are measured on the same records and the datastore never holds them.
"""
from __future__ import annotations

import collections
import glob
import gzip
import itertools
import json
from pathlib import Path

from specdemo import ASSETS
from specdemo.offline.sharegpt import is_heldout_record, split_name

# the shipped corpora, and folders of shards: `sharegpt/` (the rest of ShareGPT, `distill --out
# assets/corpus/sharegpt/`), `tasks/` and `tasks-2/` (task requests, `distill --prompts tasks --out ...`; a second
# folder since a shard folder's manifest is fixed when it starts)
CORPUS_DIR = ASSETS / "corpus"
PROMPTS_PATH = CORPUS_DIR / "prompts.jsonl"
SELFDISTILL_PATH = CORPUS_DIR / "selfdistill.jsonl.gz"
SHAREGPT_DISTILL_PATH = CORPUS_DIR / "sharegpt_distill.jsonl.gz"  # `python -m specdemo distill`, see README
CODE_DISTILL_PATH = CORPUS_DIR / "code_distill.jsonl.gz"  # `distill --prompts stdlib`: the target writing code
# `distill --prompts tasks`: summaries, grounded answers and translations asked of ShareGPT's own text
TASKS_DISTILL_PATH = CORPUS_DIR / "tasks_distill.jsonl.gz"
DISTILLED_CORPORA = (SELFDISTILL_PATH, SHAREGPT_DISTILL_PATH, CODE_DISTILL_PATH, TASKS_DISTILL_PATH)
FORMAT = "specdemo-selfdistill"
VERSION = 2


def distilled_corpora() -> list[Path]:
    """The shipped corpora and every finished shard (an unfinished one is only a journal, which this skips)."""
    shards = CORPUS_DIR.glob("*/shard-*.jsonl.gz")
    return list(DISTILLED_CORPORA) + sorted(shards, key=lambda path: (path.parent.name, path.name))


def expand(paths: list[str | Path]) -> list[Path]:
    """Paths with shell globs expanded (sorted; a pattern matching nothing is an error, so a typo is not silent) and
    a directory read as its shards."""
    out: list[Path] = []
    for p in map(str, paths):
        if Path(p).is_dir():
            p = str(Path(p) / "shard-*.jsonl.gz")
        if glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise FileNotFoundError(f"no training data matches {p}")
            out += map(Path, hits)
        else:
            out.append(Path(p))
    return out


def read_records(paths: list[str | Path]) -> list[dict]:
    """Records {"id", "prompt_ids", "answer_ids"} of distilled corpora (.jsonl[.gz], globs, shard directories) or of
    plain {"ids": [...], "start": n} JSONL (extra text such as stdlib code: the first `start` ids are context, the rest
    is trained on)."""
    out = []
    for path in expand(paths):
        if not path.exists():
            raise FileNotFoundError(f"training data {path} not found (make it with `python -m specdemo distill`)")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
        if first.get("format") == FORMAT:  # a distilled corpus, with the journal of an unfinished run
            out += [{"id": str(r["id"]), "prompt_ids": list(r["prompt_ids"]), "answer_ids": list(r["answer_ids"])}
                    for r in read_corpus(path)[1] if "prompt_ids" in r and "answer_ids" in r]
            continue
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                r = json.loads(line)
                if "prompt_ids" in r and "answer_ids" in r:
                    out.append({"id": str(r.get("id", n)), "prompt_ids": list(r["prompt_ids"]),
                                "answer_ids": list(r["answer_ids"])})
                elif "ids" in r:
                    start = int(r.get("start", 1))
                    out.append({"id": str(r.get("id", f"{path.name}:{n}")), "prompt_ids": list(r["ids"][:start]),
                                "answer_ids": list(r["ids"][start:])})
    return out


def answer_counts(paths: list[str | Path]) -> collections.Counter:
    """How often each token occurs in the answers of the corpora at `paths` (globs and shard folders too), one file
    at a time: the frequencies a draft vocabulary is ranked by."""
    counts: collections.Counter = collections.Counter()
    for path in expand(paths):
        for r in read_records([path]):
            counts.update(r["answer_ids"])
    return counts


def split_heldout(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training, held-out) by the one shared split."""
    return ([r for r in records if not is_heldout_record(r["id"])],
            [r for r in records if is_heldout_record(r["id"])])


def heldout_sample(held: list[dict], limit: int) -> list[dict]:
    """The first `limit` held-out records, alternating ShareGPT and project prompts so both kinds are measured: every
    trainer evaluates on this sample, so their held-out numbers are measured on the same records."""
    by_source = [[r for r in held if split_name(r["id"]) == name] for name in ("sharegpt", "project")]
    mixed = [r for pair in itertools.zip_longest(*by_source) for r in pair if r is not None]
    return mixed[:limit]


def read_corpus(path: Path) -> tuple[dict | None, list[dict]]:
    """(header, records) of a distilled corpus, the journal of an unfinished run included."""
    header, records = None, []
    if path.exists():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not lines or lines[0].get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} file")
        header, records = lines[0], lines[1:]
    journal = journal_path(path)
    if journal.exists():
        with open(journal, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # the line a killed run was writing
                if row.get("format") == FORMAT:
                    header = header or row
                else:
                    records.append(row)
    seen: set[str] = set()
    unique = [r for r in records if not (r["id"] in seen or seen.add(r["id"]))]
    return header, unique


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal.jsonl")
