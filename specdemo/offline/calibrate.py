"""`python -m specdemo calibrate`: fit the drafters' acceptance calibration (calibration.py) on unseen ShareGPT prompts.

Each method decodes those prompts with its trees *uncut* (dynamic sizing off, the dynamic cap as the budget), and
every proposed node is recorded with its raw score, source, depth and whether it ended on the accepted path.  For a
node that is well defined whatever the rest of the tree holds: the target's choice at a position does not depend on
the draft (greedy, and sampling with the engine's position-keyed noise), so a node is accepted exactly when its path
spells what the target commits.  Greedy decoding and sampling get separate tables: sampling accepts less.

Prompts: first user turns of ShareGPT's *held-out* split that no corpus distilled, decontaminated against HumanEval
and Spec-Bench like every training prompt.  Held-out conversations are never distilled into training shards, so
however much of ShareGPT the corpus grows to cover, REST cannot retrieve their answers and the heads and the adapter
never train on them; the held-out records the trainers evaluate on (distilled with `distill --heldout`) are left out
too.  The evaluation sets are never used here.

`--tune-prompts PATH` calibrates nothing: it writes the `--tune-n` turns that follow the calibration's own `--prompts`
in the same order, as {"id", "prompt"} lines: the prompts defaults (tree shapes, graft lengths) are tuned on, with
`python -m specdemo bench --prompts PATH`, before they are confirmed on the held-out evaluation sets.

    python -m specdemo calibrate --tune-prompts runs/tune_sharegpt.jsonl --tune-n 24
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from specdemo.bench import parse_options
from specdemo.calibration import FORMAT, default_path, fit
from specdemo.drafters import make_drafter
from specdemo.engine import GenerationConfig, generate
from specdemo.offline import sharegpt
from specdemo.offline.corpus import distilled_corpora, read_corpus
from specdemo.sampling import SamplingConfig
from specdemo.target import load_target

METHOD_OPTIONS = {  # uncut trees, as large as the dynamic mode's cap
    "rest": {"dynamic": False, "calibration": "none", "budget": 24},
    "s4c": {"dynamic": False, "calibration": "none", "budget": 16},
    "sdsat": {"dynamic": False, "calibration": "none"},
}
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "seed": 7}  # the sampling table's settings (README's sampling runs)


def calibration_prompts(n: int, max_prompt_tokens: int, target) -> list[tuple[str, list[int]]]:
    """(id, prompt ids) of `n` ShareGPT held-out first turns that no corpus distilled, in a fixed order."""
    return [(pid, ids) for pid, _, ids in calibration_turns(n, max_prompt_tokens, target)]


def calibration_turns(n: int, max_prompt_tokens: int, target) -> list[tuple[str, str, list[int]]]:
    """(id, user text, prompt ids) of the first `n` such turns; the calibration takes the first ones, tuning runs
    (`--tune-prompts`) the ones after them."""
    seen = set()
    for path in distilled_corpora():
        _, records = read_corpus(Path(path))
        seen.update(sharegpt.conversation_id(conv) for r in records
                    if (conv := sharegpt.source_conversation(r.get("id", ""))) is not None)
    convs = sharegpt.conversations(decontaminate=sharegpt.Decontaminator.for_evaluation_sets())
    pool = [c for c in convs if c.heldout and sharegpt.conversation_id(c.id) not in seen]
    pool.sort(key=lambda c: hashlib.blake2b(f"calibrate:{c.id}".encode(), digest_size=8).digest())
    out = []
    for c in pool:
        ids = target.encode_chat(c.chat[:1])
        if 8 <= len(ids) <= max_prompt_tokens:
            out.append((f"sg:{c.id}:0", c.chat[0]["content"], ids))
        if len(out) == n:
            break
    return out


def node_rows(events) -> list[tuple[str, int, float, bool]]:
    """(source, depth, raw score, accepted) of every draft node of every step."""
    rows = []
    for ev in events:
        tree = ev.tree
        if not len(tree) or tree.scores is None:
            continue
        accepted = set(ev.accepted_nodes)
        for i, d in enumerate(tree.depths()):
            if not tree.is_probe(i):
                rows.append((tree.sources[i] if tree.sources else "draft", d, float(tree.scores[i]), i in accepted))
    return rows


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the drafters' acceptance calibration on unseen ShareGPT prompts")
    p.add_argument("--model", default="embedded")
    p.add_argument("--methods", default="rest,s4c,sdsat")
    p.add_argument("--prompts", type=int, default=32, help="ShareGPT held-out prompts no corpus distilled (default 32)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--modes", default="greedy,sampling")
    p.add_argument("--out", default=None, help="default: assets/calibration/<model>.json")
    p.add_argument("--update", action="store_true",
                   help="keep the other methods' tables of an existing file made with the same prompts and settings "
                        "(refit one drafter after changing it)")
    p.add_argument("--tune-prompts", default=None, metavar="PATH.jsonl",
                   help="instead of calibrating, write the tuning prompts (the turns after the calibration's) here")
    p.add_argument("--tune-n", type=int, default=24, help="with --tune-prompts: how many")
    p.add_argument("--option", action="append", default=[],
                   help="METHOD.NAME=VALUE drafter option, repeatable (e.g. sdsat.adapter=DIR to calibrate a candidate "
                        "adapter into its own --out before comparing it with the bench)")
    p.set_defaults(func=_cli)


def write_tune_prompts(target, path: Path, n: int, skip: int, max_prompt_tokens: int) -> int:
    """The `n` turns after the calibration's `skip` as {"id", "prompt"} JSONL at `path`; returns how many."""
    picked = calibration_turns(skip + n, max_prompt_tokens, target)[skip:]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for pid, text, _ in picked:
            f.write(json.dumps({"id": pid, "prompt": text}) + "\n")
    return len(picked)


def _kept(out: Path, target, prompts, args) -> tuple[dict, dict, dict]:
    """(tables, counts, commands) of an existing calibration file, to be updated method by method; refused when it was
    made for another tokenizer or on other prompts or settings (its tables would not be comparable)."""
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}, {}, {}
    same = (old.get("format") == FORMAT and old.get("tokenizer") == target.identity
            and old.get("prompts") == [pid for pid, _ in prompts] and old.get("max_new_tokens") == args.max_new_tokens
            and old.get("sampling") == SAMPLING)
    if not same:
        raise ValueError(f"{out} was made for another tokenizer, other prompts or other settings: rebuild it whole "
                         f"(without --update).")
    legacy = old.get("command")  # files from before per-method commands: one command made every table
    commands = old.get("commands") or {mode: {m: legacy for m in t} for mode, t in old.get("tables", {}).items()}
    return old.get("tables", {}), old.get("counts", {}), commands


def _cli(args) -> int:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_OPTIONS]
    if unknown:
        raise ValueError(f"calibrate knows {', '.join(METHOD_OPTIONS)}; got {', '.join(unknown)}")
    options = parse_options(args.option)
    if options and args.update:
        raise ValueError("--option calibrates a variant into a file of its own (--out): not with --update, which "
                         "would mix its tables with those of the shipped drafters")
    target = load_target(args.model)
    if args.tune_prompts:
        n = write_tune_prompts(target, Path(args.tune_prompts), args.tune_n, args.prompts, args.max_prompt_tokens)
        print(f"wrote {n} prompts to {args.tune_prompts}")
        return 0
    prompts = calibration_prompts(args.prompts, args.max_prompt_tokens, target)
    out = Path(args.out) if args.out else default_path(target.name)
    command = "python -m specdemo calibrate " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["calibrate"] else [])
    tables, counts, commands = _kept(out, target, prompts, args) if args.update else ({}, {}, {})
    collection = {m: {**o, **options.get(m, {})} for m, o in METHOD_OPTIONS.items()}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        sampling = SamplingConfig() if mode == "greedy" else SamplingConfig(**SAMPLING)
        for method in methods:
            rows, t0 = [], time.perf_counter()
            for k, (pid, ids) in enumerate(prompts):
                drafter = make_drafter(method, target, **collection[method])
                cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=sampling)
                rows += node_rows(generate(target, ids, drafter, cfg))
                print(f"\r{mode} {method}: {k + 1}/{len(prompts)} prompts, {len(rows)} nodes", end="",
                      file=sys.stderr, flush=True)
            print(f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            tables.setdefault(mode, {})[method] = fit(rows)
            counts.setdefault(mode, {})[method] = {"nodes": len(rows), "accepted": int(sum(r[3] for r in rows))}
            commands.setdefault(mode, {})[method] = command
    data = {"format": FORMAT, "version": 1, "model": target.name, "tokenizer": target.identity,
            "commands": commands, "prompts": [pid for pid, _ in prompts], "max_new_tokens": args.max_new_tokens,
            "sampling": SAMPLING, "collection": collection, "counts": counts, "tables": tables}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)
    print(f"wrote {out}")
    return 0
