"""Building REST datastores: documents (files, chats, token ids) -> token array + suffix array + manifest, written
atomically.  The format and its lookup are datastore.py beside this file.

The offline CLI (`python -m specdemo datastore`, specdemo/offline/build_datastore.py) and the page's "Your datastore"
both build through `build` / `build_from_paths`; the default store's recipe (which corpora go in) lives with the CLI,
and `store_is_current` is the rule by which a built store is kept or rebuilt.
"""
from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from specdemo.drafters.rest.datastore import (
    FORMAT,
    VERSION,
    DatastoreError,
    dtype_for_vocab,
    file_sha256,
    separator_for,
)
from specdemo.target import tokenizer_identity

RECIPE_KEY = "default_recipe"  # the manifest field that marks a store built automatically, by which recipe
TEXT_SUFFIXES = (".py", ".txt", ".md", ".jsonl", ".jsonl.gz")
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}


def collect_files(inputs: Iterable[str | Path], skip_dirs: set[str] = SKIP_DIRS) -> list[Path]:
    """Every readable corpus file under `inputs` (files or folders), sorted, without duplicates."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item).expanduser()
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in skip_dirs and not d.startswith("."))
                out.extend(Path(root) / f for f in sorted(files) if f.endswith(TEXT_SUFFIXES))
        elif p.is_file():
            out.append(p)
        else:
            raise DatastoreError(f"Input {p} does not exist: give files or folders of .py/.txt/.md/.jsonl text.")
    seen, uniq = set(), []
    for f in out:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            uniq.append(f)
    return uniq


_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
         "chatgpt": "assistant", "model": "assistant", "system": "system"}


def _chat_text(messages: list, tokenizer) -> str:
    msgs = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = _ROLE.get(str(m.get("role", m.get("from", "user"))).lower(), "user")
        content = m.get("content", m.get("value", ""))
        if isinstance(content, str) and content:
            msgs.append({"role": role, "content": content})
    if not msgs:
        return ""
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False)
        except Exception:  # templates that insist on strict alternation etc.: fall back to plain text
            pass
    return "\n\n".join(m["content"] for m in msgs)


def record_text(rec: dict, tokenizer) -> str:
    """The text of one jsonl record: a `text` field, or a chat (`conversations` / `messages`) rendered as the model sees it."""
    if isinstance(rec.get("text"), str):
        return rec["text"]
    for key in ("conversations", "messages"):
        if isinstance(rec.get(key), list):
            return _chat_text(rec[key], tokenizer)
    return ""


def iter_file_documents(path: Path, tokenizer) -> Iterator[str]:
    name = path.name
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatastoreError(f"{path}:{n} is not valid JSON ({exc.msg}); fix or remove the line.") from exc
                if isinstance(rec, dict) and (text := record_text(rec, tokenizer)):
                    yield text
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield text


def _split_long(text: str, limit: int = 1 << 20) -> list[str]:
    """Very long documents go to the tokenizer in ~1 MB pieces cut at line ends (same document, no separator)."""
    if len(text) <= limit:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + limit)
        if end < len(text):
            nl = text.rfind("\n", start, end)
            end = nl + 1 if nl > start else end
        pieces.append(text[start:end])
        start = end
    return pieces


def _encoder(tokenizer):
    """A fast batch encoder (Rust, multithreaded) returning lists of ids without special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast"):
        return lambda texts: [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    if backend is not None:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]


def _progress(total: int | None, desc: str, unit: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=not enabled, file=sys.stderr,
                mininterval=0.5)


def suffix_order(tokens: np.ndarray, separator: int) -> np.ndarray:
    """The `sa.npy` entries for a token array: end offsets sorted by the reversed prefix (see datastore.py)."""
    import pydivsufsort

    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    # pydivsufsort sorts integer arrays through a big-endian byte view, keeping the offsets aligned to whole tokens
    rev = np.ascontiguousarray(tokens[::-1])
    r = pydivsufsort.divsufsort(rev).astype(np.int64, copy=False)
    ends = n - r  # entry for rev[r:] = tokens[:n-r] read backwards
    keep = ends < n
    ends = ends[keep]
    keep = (tokens[ends - 1] != separator) & (tokens[ends] != separator)
    ends = ends[keep]
    return ends.astype(np.int32 if n < 2**31 - 1 else np.int64)


class _Documents:
    """The store's token array under construction: documents of checked token ids, each followed by the separator
    (retrieval never matches across a document boundary)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.dtype = dtype_for_vocab(vocab)
        self.sep = separator_for(self.dtype)
        self.sep_arr = np.array([self.sep], dtype=self.dtype)
        self.parts: list[np.ndarray] = [self.sep_arr]
        self.n_docs = self.n_tokens = 0

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if not len(arr):
            return
        bad = (arr < 0) | (arr >= self.vocab)
        if bad.any():
            raise DatastoreError(
                f"Token id {int(arr[bad][0])} is out of range for this tokenizer (vocabulary of {self.vocab}): the "
                f"token ids were made with another tokenizer. Re-tokenise the corpus with this model's tokenizer.")
        self.parts += [arr.astype(self.dtype), self.sep_arr]
        self.n_docs += 1
        self.n_tokens += len(arr)

    def tokens(self) -> np.ndarray:
        out = np.concatenate(self.parts)
        self.parts = []  # the pieces would double the peak memory of a large build
        return out


def _tokenise(texts: Iterable[str], tokenizer, docs: _Documents, total_bytes: int | None, progress: bool,
              batch_chars: int) -> None:
    """Tokenise `texts` in batches of about `batch_chars` characters (the fast tokenizer runs a batch in parallel);
    a long text is split into pieces and its ids joined again, so each text stays one document."""
    encode = _encoder(tokenizer)
    bar = None  # made on the first text (a build from token ids only shows no tokenising bar)
    batch: list[str] = []
    doc_ends: list[bool] = []  # per piece in the batch: last piece of its document?

    def flush() -> None:
        nonlocal bar
        pending: list[list[int]] = []
        for ids, last in zip(encode(batch), doc_ends):
            pending.append(ids)
            if last:
                docs.add(list(itertools.chain.from_iterable(pending)) if len(pending) > 1 else pending[0])
                pending = []
        if bar is None:
            bar = _progress(total_bytes, "tokenising", "B" if total_bytes else "docs", progress)
        bar.update(sum(len(t.encode("utf-8", errors="replace")) for t in batch) if total_bytes else len(batch))
        batch.clear()
        doc_ends.clear()

    batch_len = 0
    for text in texts:
        pieces = _split_long(text)
        batch += pieces
        doc_ends += [k == len(pieces) - 1 for k in range(len(pieces))]
        batch_len += sum(map(len, pieces))
        if batch_len >= batch_chars and doc_ends[-1]:
            flush()
            batch_len = 0
    if batch:
        flush()
    if bar is not None:
        bar.close()


def _write_store(out_dir: Path, tokens: np.ndarray, sa: np.ndarray, manifest: dict, t_start: float) -> dict:
    """Write tokens.npy + sa.npy + manifest.json into a temp folder next to `out_dir`, then rename it into place, so
    a reader never sees a half-written store.  The manifest's build time runs from `t_start` to the last file."""
    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "tokens.npy", tokens)
    np.save(tmp / "sa.npy", sa)
    manifest["files"] = {name: {"bytes": (tmp / name).stat().st_size, "sha256": file_sha256(tmp / name)}
                         for name in ("tokens.npy", "sa.npy")}
    manifest["build_seconds"] = round(time.perf_counter() - t_start, 2)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out_dir)
    return manifest


def build(
    out_dir: str | Path,
    tokenizer,
    texts: Iterable[str] = (),
    token_docs: Iterable[Sequence[int]] = (),
    sources: list[str] | None = None,
    total_bytes: int | None = None,
    progress: bool = True,
    extra: dict | None = None,
    batch_chars: int = 1 << 21,
) -> dict:
    """Tokenise `texts` (batched, parallel) and append `token_docs` (already token ids of this tokenizer), one document
    each; write tokens.npy + sa.npy + manifest.json into `out_dir` (atomically: a temp folder renamed at the end).
    Returns the manifest."""
    t_start = time.perf_counter()
    docs = _Documents(len(tokenizer))
    _tokenise(texts, tokenizer, docs, total_bytes, progress, batch_chars)
    for ids in token_docs:
        docs.add(ids)
    tokenize_s = time.perf_counter() - t_start
    if docs.n_tokens == 0:
        raise DatastoreError("The corpus is empty: no text was found in the inputs. Give .py/.txt/.md files, .jsonl "
                             "files with `text` or `conversations`/`messages` fields, or folders holding them.")
    tokens = docs.tokens()
    t0 = time.perf_counter()
    if progress:
        print(f"sorting {len(tokens):,} tokens ...", file=sys.stderr, flush=True)
    sa = suffix_order(tokens, docs.sep)
    sort_s = time.perf_counter() - t0
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": tokenizer_identity(tokenizer),
        "tokenizer_name": getattr(tokenizer, "name_or_path", ""),
        "vocab_size": docs.vocab,
        "dtype": docs.dtype.name,
        "separator": docs.sep,
        "documents": docs.n_docs,
        "tokens": docs.n_tokens,
        "entries": int(len(sa)),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tokenize_seconds": round(tokenize_s, 2),
        "sort_seconds": round(sort_s, 2),
        "sources": sources or [],
        **(extra or {}),
    }
    return _write_store(Path(out_dir), tokens, sa, manifest, t_start)


def build_from_paths(out_dir: str | Path, tokenizer, inputs: Sequence[str | Path], progress: bool = True,
                     skip_dirs: set[str] = SKIP_DIRS, token_docs: Iterable[Sequence[int]] = (),
                     extra_sources: list[str] | None = None, extra: dict | None = None) -> dict:
    """`build` from every corpus file under `inputs` (files or folders, see collect_files), plus `token_docs`;
    the manifest's sources name the inputs.  Returns the manifest."""
    files = collect_files(inputs, skip_dirs)
    total = sum(f.stat().st_size for f in files)

    def texts() -> Iterator[str]:
        for f in files:
            yield from iter_file_documents(f, tokenizer)

    sources = [str(Path(p)) for p in inputs] + (extra_sources or [])
    return build(out_dir, tokenizer, texts(), token_docs, sources=sources, total_bytes=total, progress=progress,
                 extra=extra)


def store_is_current(out_dir: str | Path, recipe: str) -> bool:
    """Whether `out_dir` holds a store to keep rather than (re)build with `recipe`: a store the user built there
    (no recipe recorded) is kept, an automatic one only while its recipe is this one."""
    mpath = Path(out_dir) / "manifest.json"
    if not mpath.exists():
        return False
    try:
        m = json.loads(mpath.read_text())
    except json.JSONDecodeError:
        m = {}
    return m.get(RECIPE_KEY) in (None, recipe) and m.get("format") == FORMAT
