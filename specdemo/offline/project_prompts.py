"""The self-distillation prompt set: the hand-written topic and task lists of prompt_texts.py, combined
deterministically into prompts.

The embedded model's greedy answers to these prompts (`python -m specdemo distill --prompts project`) form the chat half of the default REST
datastore and the training corpus of the S4C / SDSAT drafters.  Every string was written for this project:
nothing is taken from HumanEval, MT-Bench or Spec-Bench (evaluation data stays out; `tests/test_datastore.py` checks
HumanEval prompts for long n-gram overlap with the distilled answers).

    python -m specdemo.offline.project_prompts            # (re)writes assets/corpus/prompts.jsonl
    python -m specdemo.offline.project_prompts --check    # fails when the file differs from what this module generates

Each record is {"id": "<category>-<n>", "category": ..., "prompt": ...}.  The order is a fixed interleaving of the
categories, so a partial distillation run (the script is resumable) still covers all of them.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from specdemo.offline.corpus import PROMPTS_PATH
from specdemo.offline.prompt_texts import (
    CODE_ASKS,
    CODE_CONCEPTS,
    CODE_LANGS,
    CODE_SNIPPETS,
    CODE_SNIPPET_ASKS,
    CODE_TASKS,
    COMPARE_PAIRS,
    EXPLAIN_ASKS,
    EXPLAIN_TOPICS,
    MATH_CONCEPTS,
    MATH_NUMBERS,
    MATH_TEMPLATES,
    PASSAGES,
    QA_QUESTIONS,
    REWRITE_SENTENCES,
    REWRITE_STYLES,
    STUBS,
    STUB_WRAPPERS,
    SUMMARY_ASKS,
    WRITING_FORMS,
    WRITING_TOPICS,
)


def _stub_code(name: str, sig: str, doc: str, examples: list[tuple[str, str]]) -> str:
    typing = [t for t in ("List", "Dict", "Tuple", "Optional") if t + "[" in sig]
    head = f"from typing import {', '.join(typing)}\n\n\n" if typing else ""
    lines = [f"def {name}({sig}:", f'    """{doc}']
    for call, result in examples:
        lines += [f"    >>> {call}", f"    {result}"]
    lines.append('    """')
    return head + "\n".join(lines) + "\n"


def generate_prompts() -> list[dict]:
    """The whole prompt set, deterministic (same list every time)."""
    by_cat: dict[str, list[str]] = {}
    by_cat["stub"] = [w.format(code=_stub_code(*s)) for i, s in enumerate(STUBS)
                      for j, w in enumerate(STUB_WRAPPERS) if (i + j) % 3 != 2]
    rng = random.Random(1234)
    # (categories are appended at the end only: ids are "<category>-<index in its list>", and a resumed distillation
    # run keeps the answers of unchanged prompts)
    by_cat["code"] = [ask.format(lang=lang, task=task) for t_i, task in enumerate(CODE_TASKS)
                      for lang, ask in [(CODE_LANGS[(t_i * 3 + k) % len(CODE_LANGS)] if k else "Python",
                                         CODE_ASKS[(t_i + k) % len(CODE_ASKS)]) for k in range(3)]]
    by_cat["code-explain"] = ([EXPLAIN_ASKS[i % 2].format(x=c) for i, c in enumerate(CODE_CONCEPTS)]
                              + [a.format(code=c) for c in CODE_SNIPPETS for a in CODE_SNIPPET_ASKS])
    by_cat["writing"] = [f"Write {WRITING_FORMS[(i * 5 + k) % len(WRITING_FORMS)]} about {t}."
                         for i, t in enumerate(WRITING_TOPICS) for k in range(3)]
    by_cat["explain"] = ([EXPLAIN_ASKS[(i + k) % len(EXPLAIN_ASKS)].format(x=t)
                          for i, t in enumerate(EXPLAIN_TOPICS) for k in range(2)]
                         + [f"What is the difference between {a} and {b}?" for a, b in COMPARE_PAIRS])
    by_cat["qa"] = list(QA_QUESTIONS)
    by_cat["math"] = ([t.format(a=a, b=b, c=c) for i, t in enumerate(MATH_TEMPLATES)
                       for a, b, c in [MATH_NUMBERS[(i + k * 3) % len(MATH_NUMBERS)] for k in range(3)]]
                      + list(MATH_CONCEPTS))
    by_cat["summarise"] = [a.format(p=p) for i, p in enumerate(PASSAGES) for a in SUMMARY_ASKS]
    by_cat["rewrite"] = [REWRITE_STYLES[(i + k) % len(REWRITE_STYLES)].format(s=s)
                         for i, s in enumerate(REWRITE_SENTENCES) for k in range(3)]
    by_cat["stub-alt"] = [w.format(code=_stub_code(*s)) for i, s in enumerate(STUBS)
                          for j, w in enumerate(STUB_WRAPPERS) if (i + j) % 3 == 2]
    # fixed interleaving: shuffle inside each category, then round-robin by share so any prefix is a balanced mix
    records = []
    queues = {}
    for cat, prompts in by_cat.items():
        order = list(range(len(prompts)))
        rng.shuffle(order)
        queues[cat] = [(f"{cat}-{k:03d}", prompts[k]) for k in order]
    total = sum(len(q) for q in queues.values())
    taken = {cat: 0 for cat in queues}
    for n in range(total):
        # the category furthest behind its proportional share goes next (ties: first in dict order)
        cat = max(queues, key=lambda c: (len(queues[c]) * (n + 1) / total - taken[c]) if taken[c] < len(queues[c])
                  else float("-inf"))
        pid, prompt = queues[cat][taken[cat]]
        taken[cat] += 1
        records.append({"id": pid, "category": cat, "prompt": prompt})
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    return records


def load_prompts(path: Path = PROMPTS_PATH) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(path: Path = PROMPTS_PATH) -> int:
    records = generate_prompts()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(records)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the self-distillation prompt set.")
    ap.add_argument("--out", type=Path, default=PROMPTS_PATH)
    ap.add_argument("--check", action="store_true", help="fail if the file differs from the generated set")
    args = ap.parse_args(argv)
    if args.check:
        ok = args.out.exists() and load_prompts(args.out) == generate_prompts()
        print("prompts up to date" if ok else f"{args.out} is stale: run python -m specdemo.offline.project_prompts")
        return 0 if ok else 1
    n = write_prompts(args.out)
    print(f"wrote {n} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
