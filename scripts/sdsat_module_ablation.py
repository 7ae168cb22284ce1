"""Which LoRA modules of an SDSAT adapter carry its drafts: held-out acceptance with only a subset of the adapter's
modules switched on (the others' LoRA-B zeroed), no retraining.  Behind the choice of gate/up-only adapters on CPU,
where every adapted module costs a hook and two small products per forward (docs/sdsat.md).

    .venv/bin/python scripts/sdsat_module_ablation.py [--adapter assets/sdsat/embedded] [--L 3]

Held-out records = the training run's split (--heldout-frac 0.1 --heldout-max 8 by default, as in TRAINING.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdemo.drafters.sdsat.adapter import default_artifact_dir, load_adapter  # noqa: E402
from specdemo.offline.train_sdsat import TrainConfig, evaluate, split_records
from specdemo.target import load_target  # noqa: E402

SUBSETS = {
    "all": None,
    "gate+up": ("gate_proj", "up_proj"),
    "mlp (gate+up+down)": ("gate_proj", "up_proj", "down_proj"),
    "q+k+v+gate+up": ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"),
    "attention (q+k+v+o)": ("q_proj", "k_proj", "v_proj", "o_proj"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--data", nargs="+", default=["assets/corpus/selfdistill.jsonl.gz"])
    ap.add_argument("--L", type=int, default=3)
    ap.add_argument("--heldout-max", type=int, default=8)
    args = ap.parse_args(argv)
    t = load_target(args.model)
    ad, _ = load_adapter(args.adapter or default_artifact_dir(t), t)
    _, held = split_records(args.data, args.heldout_max, TrainConfig.max_seq)
    saved = {k: v.detach().clone() for k, v in ad.lora_B.items()}
    for name, keep in SUBSETS.items():
        if keep is not None and not set(keep) <= set(ad.targets):
            continue
        with torch.no_grad():
            for k, v in ad.lora_B.items():
                on = keep is None or k.rsplit("__", 1)[-1] in keep
                v.copy_(saved[k] if on else torch.zeros_like(v))
        m = evaluate(t.model, ad, held, args.L)
        print(json.dumps({"modules": name, "top1_by_depth": m["top1_by_depth"], "top5_by_depth": m["top5_by_depth"],
                          "mean_accepted_run": m["mean_accepted_run"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
