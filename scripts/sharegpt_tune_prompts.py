"""Write tuning prompts: first user turns of ShareGPT's training split that neither a shipped corpus distilled nor
`python -m specdemo calibrate` uses (they follow its prompts in the same fixed order).  Defaults (tree shapes, graft
lengths) are chosen on these, then confirmed on the held-out evaluation sets.

    python scripts/sharegpt_tune_prompts.py --n 24 --out runs/tune_sharegpt.jsonl
    python -m specdemo bench --prompts runs/tune_sharegpt.jsonl ...
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdemo.offline.calibrate import training_turns
from specdemo.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--skip", type=int, default=32, help="the calibration's prompts (calibrate --prompts)")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--out", default="runs/tune_sharegpt.jsonl")
    args = ap.parse_args()
    target = load_target("embedded")
    picked = training_turns(args.skip + args.n, args.max_prompt_tokens, target)[args.skip:]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for pid, text, _ in picked:
            f.write(json.dumps({"id": pid, "prompt": text}) + "\n")
    print(f"wrote {len(picked)} prompts to {out}")


if __name__ == "__main__":
    main()
