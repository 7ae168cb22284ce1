"""S4C heads' teacher-forced accuracy on the target's own answers to a bench run's prompts, overall and per group.

The trainers' held-out figure is measured on ShareGPT-style records; this measures the same thing (each head's top-1
against the target's greedy choice over its whole vocabulary, and the chain of heads 1..d all right) on the answers a
bench run recorded (its AR row's tokens), so a head's accuracy on the benchmark's kind of request can be read apart
from the tree, the cost curve and the clock:

    python -m specdemo bench --prompts spec_bench:tune --per-group 4 --max-new-tokens 64 --methods ar --json B.json
    python scripts/heads_on_answers.py B.json assets/s4c/smollm2-135m-instruct runs/other_heads
"""
from __future__ import annotations

import argparse
import json
import tempfile
import types

import torch

from specdemo.drafters.s4c.heads import load_heads
from specdemo.offline.feature_store import FeatureStore, extract
from specdemo.offline.train_s4c import evaluate
from specdemo.prompts import load_prompts
from specdemo.target import load_target


def answer_records(target, bench: dict, prompt_set: str) -> list[dict]:
    """The bench's AR answers as training-style records {"id", "ids", "start", "group"}."""
    prompts = {p["id"]: p for p in load_prompts(prompt_set)}
    out = []
    for row in bench["methods"]["ar"]["per_prompt"]:
        ids = list(target.encode_prompt(prompts[row["id"]]["prompt"]))
        out.append({"id": row["id"], "ids": ids + row["tokens"], "start": len(ids), "group": row.get("group") or "all"})
    return out


def accuracy(heads, records: list[dict], store: FeatureStore, device) -> dict[str, tuple[float, float]]:
    """Per head: (top-1, chain) against the target's choice over its whole vocabulary."""
    m = evaluate(heads, records, store, types.SimpleNamespace(batch_size=8, loss_weights=[0.1, 1.0, 1.0]), device)
    return {h: (x["top1_full"], x["chain_full"]) for h, x in m.items() if isinstance(x, dict)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", help="a bench JSON with an `ar` row")
    p.add_argument("heads", nargs="+", help="head folders to compare")
    p.add_argument("--prompts", default="spec_bench", help="the prompt set the bench ran (its ids are looked up here)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("embedded", precision="fp32")
    with open(args.bench) as f:
        records = answer_records(target, json.load(f), args.prompts)
    groups = sorted({r["group"] for r in records})
    with tempfile.TemporaryDirectory(prefix="heads-on-answers-") as folder:
        store = FeatureStore(folder, 160, 512)
        extract(target, records, store, (), log=lambda m: None)
        for source in args.heads:
            heads = load_heads(target, source).float()
            print(source, "all", accuracy(heads, records, store, target.device))
            for g in groups if len(groups) > 1 else ():
                print("   ", g, accuracy(heads, [r for r in records if r["group"] == g], store, target.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
