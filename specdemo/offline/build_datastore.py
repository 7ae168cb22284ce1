"""Building REST datastores (offline): corpora -> token array + suffix array, the embedded model's default store,
and the `python -m specdemo datastore` CLI.  The format and its lookup are specdemo/drafters/rest/datastore.py."""
from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from specdemo.drafters.rest.datastore import (
    FORMAT,
    VERSION,
    Datastore,
    DatastoreError,
    _sha256,
    build_command,
    default_dir,
    dtype_for_vocab,
    separator_for,
)
from specdemo.offline.corpus import DISTILLED_CORPORA, read_corpus, split_heldout
from specdemo.offline.sharegpt import Decontaminator
from specdemo.target import (
    EMBEDDED,
    ModelLoadError,
    embedded_dir,
    load_target,
    tokenizer_identity,
)

TEXT_SUFFIXES = (".py", ".txt", ".md", ".jsonl", ".jsonl.gz")


SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}


# the default store's stdlib part: no tests, no IDLE / demos, no bundled third-party code
STDLIB_SKIP_DIRS = SKIP_DIRS | {"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages",
                                "dist-packages", "ensurepip", "lib2to3", "pydoc_data"}


DEFAULT_RECIPE = "stdlib+selfdistill+sharegpt-distill+code-distill"


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


def iter_dataset_documents(name: str, tokenizer, split: str = "train", config: str | None = None,
                           limit: int = 0) -> Iterator[str]:
    """Documents of a Hugging Face `datasets` dataset (needs the package and network access)."""
    try:
        import datasets  # noqa: PLC0415  (optional, imported only when asked for)
    except ImportError as exc:
        raise DatastoreError("Building from a hub dataset needs the `datasets` package: `pip install datasets` "
                             "(and network access), or pass local files with --input.") from exc
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as exc:
        raise DatastoreError(f"Cannot load dataset '{name}' (split {split}): {type(exc).__name__}: "
                             f"{str(exc)[:300]}. Offline? Pass local files with --input instead.") from exc
    for i, rec in enumerate(ds):
        if limit and i >= limit:
            break
        if text := record_text(rec, tokenizer):
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


def load_tokenizer(model: str):
    """The tokenizer of a model name as `load_target` understands it, without loading any weights."""
    from transformers import AutoTokenizer

    path = str(embedded_dir()) if model == EMBEDDED else model
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"Cannot load the tokenizer of '{model}': {type(exc).__name__}: {str(exc)[:300]}") from exc


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
    """The `sa.npy` entries for a token array: end offsets sorted by the reversed prefix (see the module docstring)."""
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
    manifest["files"] = {name: {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
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
    files = collect_files(inputs, skip_dirs)
    total = sum(f.stat().st_size for f in files)

    def texts() -> Iterator[str]:
        for f in files:
            yield from iter_file_documents(f, tokenizer)

    sources = [str(Path(p)) for p in inputs] + (extra_sources or [])
    return build(out_dir, tokenizer, texts(), token_docs, sources=sources, total_bytes=total, progress=progress,
                 extra=extra)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The `.py` files of the default store's stdlib part (no tests, IDLE, demos or bundled third-party code), sorted:
    the code prompts (code_prompts.py) are built from the same files."""
    return [f for f in collect_files([stdlib_dir()], STDLIB_SKIP_DIRS) if f.suffix == ".py"]


def selfdistill_docs(path: Path, identity: str) -> tuple[list[list[int]], str]:
    """The self-distilled answers as documents: the assistant header + the answer ids (ends with EOS when finished)."""
    if not path.exists():
        return [], ""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, identity)
    if key not in _selfdistill_cache:
        _selfdistill_cache.clear()
        _selfdistill_cache[key] = _read_selfdistill(path, identity)
    docs, digest = _selfdistill_cache[key]
    return [list(d) for d in docs], digest


_selfdistill_cache: dict[tuple, tuple[list[list[int]], str]] = {}


def _read_selfdistill(path: Path, identity: str) -> tuple[list[list[int]], str]:
    header, records = read_corpus(path)
    records = split_heldout(records)[0]  # held-out stays unseen
    if header.get("tokenizer") != identity or not records:
        return [], ""
    # the common tail of all chat-templated prompts ("<|im_end|>\n<|im_start|>assistant\n"): answers start after it
    tail = records[0]["prompt_ids"]
    for r in records[1:]:
        p = r["prompt_ids"]
        k = 0
        while k < min(len(tail), len(p)) and tail[-1 - k] == p[-1 - k]:
            k += 1
        tail = tail[len(tail) - k:]
    head = tail[-8:]
    digest = hashlib.sha256(json.dumps([r["answer_ids"] for r in records]).encode()).hexdigest()[:12]
    return [head + r["answer_ids"] for r in records], digest


def ensure_default(target, progress: bool = True, stdlib_limit: int = 0, out_dir: Path | None = None) -> Path:
    """The default datastore of the embedded model, built on first use (stdlib source + self-distilled answers).

    For another model the default folder must have been built with the CLI; raises DatastoreError with the command.
    """
    out = out_dir or default_dir(target.identity)
    docs, digests, counts = [], [], []
    for path in DISTILLED_CORPORA if target.name == EMBEDDED else ():
        d, digest = selfdistill_docs(path, target.identity)
        docs += d
        digests.append(digest)
        if d:
            counts.append(f"{path.name} ({len(d)} answers)")
    digest = "+".join(digests)
    recipe = f"{DEFAULT_RECIPE}:{sys.version_info.major}.{sys.version_info.minor}:{digest}:{stdlib_limit}"
    mpath = out / "manifest.json"
    if mpath.exists():
        try:
            m = json.loads(mpath.read_text())
        except json.JSONDecodeError:
            m = {}
        # a store the user built there is kept; an automatic one is rebuilt when its recipe changed
        if m.get("default_recipe") in (None, recipe) and m.get("format") == FORMAT:
            return out
    if target.name != EMBEDDED:
        raise DatastoreError(
            f"REST has no datastore for model '{target.name}'. Build one from text in its domain with "
            f"`{build_command(target.name)}` (it goes to {out}, where REST finds it), or pass a datastore path.")
    files = stdlib_files()
    if stdlib_limit:
        files = files[:stdlib_limit]
    check = Decontaminator.for_evaluation_sets()  # evaluation text never reaches a datastore
    files = [f for f in files if check.clean(f.read_text(encoding="utf-8", errors="replace"))]
    if progress:
        print(f"specdemo: building the REST datastore for the embedded model (first use only): {len(files)} Python "
              f"standard-library files + {len(docs)} self-distilled answers -> {out}", file=sys.stderr, flush=True)
    tok = target.tokenizer

    def texts() -> Iterator[str]:
        for f in files:
            yield from iter_file_documents(f, tok)

    total = sum(f.stat().st_size for f in files)
    sources = [f"{stdlib_dir()} (.py, without tests/idlelib/turtledemo/site-packages; {len(files)} files)"]
    sources += counts
    build(out, tok, texts(), docs, sources=sources, total_bytes=total, progress=progress,
          extra={"default_recipe": recipe})
    return out


def _cmd_build(args) -> int:
    tok = load_tokenizer(args.model)
    out = Path(args.out) if args.out else default_dir(tokenizer_identity(tok))
    t0 = time.perf_counter()
    if args.dataset:
        def texts() -> Iterator[str]:
            for p in collect_files(args.input or []):
                yield from iter_file_documents(p, tok)
            yield from iter_dataset_documents(args.dataset, tok, args.split, args.dataset_config, args.limit_docs)

        sources = list(args.input or []) + [f"hf:{args.dataset}:{args.split}"]
        m = build(out, tok, texts(), sources=sources, total_bytes=None, progress=True)
    else:
        if not args.input:
            raise DatastoreError("Nothing to build from: give --input PATHS... (files or folders) or --dataset NAME.")
        m = build_from_paths(out, tok, args.input, progress=True)
    dt = time.perf_counter() - t0
    print(f"built {out}: {m['documents']:,} documents, {m['tokens']:,} tokens ({m['dtype']}) in {dt:.1f} s "
          f"({m['tokens'] / max(dt, 1e-9) / 1e3:.0f}k tokens/s; tokenising {m['tokenize_seconds']} s, suffix array "
          f"{m['sort_seconds']} s)")
    if args.out and args.model == EMBEDDED:
        print(f"use it with: --method rest --option datastore={out}")
    return 0


def _cmd_default(args) -> int:
    print(f"default datastore ready in {ensure_default(load_target())}")
    return 0


def _cmd_info(args) -> int:
    d = Datastore(args.dir, verify=not args.quick)
    m = d.manifest
    size = sum(info["bytes"] for info in m["files"].values())
    print(f"{d.path}\n  format {m['format']} v{m['version']}, built {m['built_at']} in {m['build_seconds']} s\n"
          f"  tokenizer {m['tokenizer']} ({m.get('tokenizer_name', '')}), vocabulary {m['vocab_size']}, {m['dtype']}\n"
          f"  {m['documents']:,} documents, {m['tokens']:,} tokens, {size / 1e6:.1f} MB on disk (hashes "
          f"{'not checked' if args.quick else 'verified'})")
    for s in m.get("sources", []):
        print(f"  source: {s}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("datastore", help="build or inspect a REST datastore")
    sub = p.add_subparsers(dest="datastore_command", required=True)
    b = sub.add_parser("build", help="tokenise files/folders into a datastore (token array + suffix array)")
    b.add_argument("--model", default="embedded", help="whose tokenizer to use: embedded, a hub id or a local path")
    b.add_argument("--input", nargs="+", metavar="PATH",
                   help="files or folders: .py .txt .md, .jsonl(.gz) with `text` or `conversations`/`messages`")
    b.add_argument("--out", help="output folder (default: the model's default datastore, which REST uses by itself)")
    b.add_argument("--dataset", help="a Hugging Face datasets name to add (needs `datasets` and network)")
    b.add_argument("--dataset-config", default=None)
    b.add_argument("--split", default="train")
    b.add_argument("--limit-docs", type=int, default=0, help="at most this many dataset records (0 = all)")
    b.set_defaults(func=_cmd_build)
    d = sub.add_parser("default", help="build (or check) the embedded model's default datastore: stdlib source + the "
                       "self-distilled answers; a no-op when it is current")
    d.set_defaults(func=_cmd_default)
    i = sub.add_parser("info", help="describe and verify a datastore")
    i.add_argument("dir")
    i.add_argument("--quick", action="store_true", help="skip the sha256 check")
    i.set_defaults(func=_cmd_info)
