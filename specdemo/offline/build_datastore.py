"""The `python -m specdemo datastore` CLI and the embedded model's default REST datastore: what goes into it (the
Python standard library's source and the self-distilled answers) and building it on first use.

Building itself (documents -> token array + suffix array) is specdemo/drafters/rest/build.py, the format and its
lookup specdemo/drafters/rest/datastore.py; the names they define are re-exported here for older imports.
"""
from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator

from specdemo.drafters.rest.build import (  # noqa: F401  (re-exported for older imports)
    RECIPE_KEY,
    SKIP_DIRS,
    TEXT_SUFFIXES,
    build,
    build_from_paths,
    collect_files,
    iter_file_documents,
    record_text,
    store_is_current,
    suffix_order,
)
from specdemo.drafters.rest.datastore import (  # noqa: F401  (re-exported for older imports)
    FORMAT,
    VERSION,
    Datastore,
    DatastoreError,
    build_command,
    default_dir,
    dtype_for_vocab,
    separator_for,
)
from specdemo.offline.corpus import distilled_corpora, read_corpus, split_heldout
from specdemo.offline.sharegpt import Decontaminator
from specdemo.target import (
    EMBEDDED,
    ModelLoadError,
    embedded_dir,
    load_target,
    tokenizer_identity,
)

# the default store's stdlib part: no tests, no IDLE / demos, no bundled third-party code
STDLIB_SKIP_DIRS = SKIP_DIRS | {"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages",
                                "dist-packages", "ensurepip", "lib2to3", "pydoc_data"}


DEFAULT_RECIPE = "stdlib+selfdistill+sharegpt-distill+code-distill"


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


def load_tokenizer(model: str):
    """The tokenizer of a model name as `load_target` understands it, without loading any weights."""
    from transformers import AutoTokenizer

    path = str(embedded_dir()) if model == EMBEDDED else model
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"Cannot load the tokenizer of '{model}': {type(exc).__name__}: {str(exc)[:300]}") from exc


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
    docs, digest, counts = _distilled_documents(target)
    recipe = f"{DEFAULT_RECIPE}:{sys.version_info.major}.{sys.version_info.minor}:{digest}:{stdlib_limit}"
    if store_is_current(out, recipe):  # a store the user built there is kept; an automatic one while current
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
          extra={RECIPE_KEY: recipe})
    return out


def _distilled_documents(target) -> tuple[list[list[int]], str, list[str]]:
    """(documents, digest, source notes) of the self-distilled corpora for the default store: the embedded model's
    only (another tokenizer's ids would be garbage).  The digest enters the recipe, so new answers rebuild it."""
    docs, digests, counts = [], [], []
    for path in distilled_corpora() if target.name == EMBEDDED else ():
        d, digest = selfdistill_docs(path, target.identity)
        docs += d
        digests.append(digest)
        if d:
            counts.append(f"{'/'.join(path.parts[-2:])} ({len(d)} answers)")  # shards of two folders share names
    return docs, "+".join(digests), counts


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
