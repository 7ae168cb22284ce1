"""Code prompts from Python's standard library: "complete this function" requests built from its documented functions.

The chat half of the self-distilled corpus teaches the drafters how the target answers questions; nothing teaches
them how it writes code when asked for a function, which is what HumanEval-style requests look like.  The standard
library is installed everywhere and documented: each top-level function with a docstring becomes a request that shows
its signature and docstring only (the body is what the target is asked to write), so the target's own answers, not
the library's code, become the corpus (`python -m specdemo distill --prompts stdlib`).

The functions come from the same files as the default datastore's stdlib part (no tests, IDLE, demos or bundled
third-party code); prompts sharing a word 10-gram with an evaluation set are dropped; the order is a fixed hash, so
`--first N` takes the same N functions on every machine with the same Python.

S4C's extra training data (`python -m specdemo distill --prompts stdlib-source`, `source_records`) pairs such a
request with the library's own code instead: not the target's answer, but S4C's training reads only the target's
teacher-forced features on it (labels are the target's own argmax), which costs one forward per record instead of
generation.  Those records come from their own, older selection (every top-level function of 150-1500 characters,
shuffled with a seed), which the shipped heads were trained on.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import random
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from specdemo.offline.build_datastore import stdlib_dir, stdlib_files
from specdemo.offline.sharegpt import Decontaminator
from specdemo.prompts import HUMANEVAL_WRAP

MIN_DOC, MAX_DOC = 40, 1200  # docstring characters: a one-liner says too little to write a body from
MAX_ARGS_CHARS = 200  # signatures longer than this are mostly keyword plumbing


def function_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`def name(args) -> ret:` plus the docstring, indented as written; None for functions without a usable one."""
    doc = ast.get_docstring(node, clean=True)
    if not doc or not MIN_DOC <= len(doc) <= MAX_DOC or '"""' in doc or "\\" in doc:
        return None
    args = ast.unparse(node.args)
    if len(args) > MAX_ARGS_CHARS:
        return None
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    body = "\n".join(("    " + line).rstrip() for line in doc.splitlines())
    return f"{prefix} {node.name}({args}){ret}:\n    \"\"\"{body.lstrip()}\n    \"\"\"\n"


def module_stubs(source: str) -> Iterator[tuple[str, str]]:
    """(function name, stub) of the documented public top-level functions of one module's source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("__"):
            stub = function_stub(node)
            if stub is not None:
                yield node.name, stub


@lru_cache(maxsize=1)
def _stdlib_stubs() -> tuple[tuple[str, str], ...]:
    """(id, stub) of every documented top-level function of the stdlib part, the first of identical stubs only, in
    the fixed hashed order (parsing the library takes seconds: done once per process)."""
    root = stdlib_dir()
    out, seen = [], set()
    for path in stdlib_files():
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for name, stub in module_stubs(path.read_text(encoding="utf-8", errors="replace")):
            if stub not in seen:
                seen.add(stub)
                out.append((f"stdlib:{module}:{name}", stub))
    out.sort(key=lambda p: hashlib.blake2b(p[0].encode(), digest_size=8).digest())
    return tuple(out)


def stdlib_prompts(limit: int = 0, decontaminate=None) -> list[dict]:
    """{"id": "stdlib:MODULE:FUNCTION", "prompt"} requests, in a fixed hashed order, at most `limit` (0 = all).

    decontaminate: a `sharegpt.Decontaminator` (default: the evaluation sets' one); prompts it rejects are dropped."""
    check = decontaminate or Decontaminator.for_evaluation_sets()
    out = [{"id": pid, "prompt": HUMANEVAL_WRAP.format(prompt=stub)} for pid, stub in _stdlib_stubs()
           if check.clean(stub)]
    return out[:limit] if limit else out


SOURCE_SKIP_PARTS = ("test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages")
SOURCE_CHARS = (150, 1500)  # a function's source: long enough to teach something, short enough for one answer


def source_functions(root: Path) -> Iterator[tuple[str, str, str]]:
    """("file.py:name", head, body) of the top-level functions of the library under `root` whose source has
    SOURCE_CHARS characters; head = the def line(s) and the docstring, body = the whole function."""
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if any(part in SOURCE_SKIP_PARTS for part in path.parts):
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except Exception:  # files that are not this Python's syntax or not UTF-8: skipped
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
                body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if not SOURCE_CHARS[0] <= len(body) <= SOURCE_CHARS[1]:
                    continue
                doc = ast.get_docstring(node)
                head_end = node.body[0].end_lineno if doc else node.body[0].lineno - 1
                head = "\n".join(lines[node.lineno - 1 : head_end])
                yield f"{path.name}:{node.name}", head, body


def source_records(target, max_tokens: int, seed: int = 0, root: Path | None = None) -> list[dict]:
    """{"id", "prompt_ids", "answer_ids"} records, until `max_tokens` answer tokens: the chat-templated request
    "Complete this Python function:" + a function's head, answered by the whole function in a ```python block and
    EOS.  The functions of `root` (default: this interpreter's standard library) in a seeded shuffle."""
    tok = target.tokenizer
    items = list(source_functions(root or Path(sysconfig.get_paths()["stdlib"])))
    random.Random(seed).shuffle(items)
    out, total = [], 0
    for fid, head, body in items:
        prompt = target.encode_prompt(f"Complete this Python function:\n```python\n{head}\n```")
        answer = tok(f"```python\n{body}\n```", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append({"id": fid, "prompt_ids": prompt, "answer_ids": answer})
        total += len(answer)
        if total >= max_tokens:
            break
    return out


def write_records(path: Path, records: list[dict]) -> None:
    """Gzip JSONL, one record a line and no header (the trainers read it as plain prompt/answer records)."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
