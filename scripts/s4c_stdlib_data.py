"""Extra S4C training data: functions from the Python standard library, framed like a code-completion chat turn.

    .venv/bin/python scripts/s4c_stdlib_data.py --out /tmp/s4c_stdlib.jsonl.gz --max-tokens 80000

Each record is {"id", "prompt_ids", "answer_ids"}: the prompt is the chat-templated request "Complete this Python
function:" + the function's signature and docstring, the answer is the whole function in a ```python block.  The
answer is NOT the model's own output: S4C training only uses the target's teacher-forced features on it (soft-CE
against the target's distribution, labels = the target's argmax), which costs one target forward per record instead
of generation.  Source: the local interpreter's stdlib (no network, nothing from any benchmark).
"""
from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def functions(root: Path):
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if any(part in ("test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages") for part in path.parts):
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except Exception:
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
                body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if not 150 <= len(body) <= 1500:
                    continue
                doc = ast.get_docstring(node)
                head_end = node.body[0].end_lineno if doc else node.body[0].lineno - 1
                head = "\n".join(lines[node.lineno - 1 : head_end])
                yield f"{path.name}:{node.name}", head, body


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=80000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from specdemo.target import load_target

    target = load_target("embedded")
    tok = target.tokenizer
    items = list(functions(Path(sysconfig.get_paths()["stdlib"])))
    random.Random(args.seed).shuffle(items)
    total, n = 0, 0
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        for fid, head, body in items:
            prompt = target.encode_prompt(f"Complete this Python function:\n```python\n{head}\n```")
            answer = tok(f"```python\n{body}\n```", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            f.write(json.dumps({"id": fid, "prompt_ids": prompt, "answer_ids": answer}) + "\n")
            total += len(answer)
            n += 1
            if total >= args.max_tokens:
                break
    print(f"wrote {n} functions, {total} answer tokens to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
