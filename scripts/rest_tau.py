"""Measure REST's tau (new tokens / target forwards) without timing anything.

    .venv/bin/python scripts/rest_tau.py --prompts humaneval --limit 20 --budgets 8,16,32
    .venv/bin/python scripts/rest_tau.py --prompts chat --limit 30 --budgets 16 --mode engine

--mode sim (default): greedy AR outputs are computed once with the engine (cached under runs/rest_tau/), then every
step of REST is replayed offline: the drafter proposes a tree for the true prefix, the accepted length is the longest
tree path that equals the AR continuation, plus the bonus token.  For greedy decoding this is exactly what the engine
does (its output equals AR), so tau is the engine's tau, and tuning a knob costs seconds instead of model time.
--mode engine: runs `specdemo.engine.run_to_end` with REST for real and checks the output equals AR.
Options of the drafter can be set with --opt key=value (repeatable), e.g. --opt context_weight=20.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _val(s: str):
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(s.lower(), s)


def ar_outputs(target, prompts: list[dict], max_new: int, tag: str) -> list[dict]:
    """Greedy AR outputs of the engine, cached per prompt set + length + tokenizer."""
    from specdemo.engine import GenerationConfig, run_to_end

    cache = ROOT / "runs" / "rest_tau" / f"ar-{tag}-{max_new}-{target.identity}.jsonl"
    done = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[r["id"]] = r
    cache.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for p in prompts:
        if p["id"] not in done:
            ids = target.encode_prompt(p["prompt"])
            t0 = time.time()
            toks, _ = run_to_end(target, ids, None, GenerationConfig(max_new_tokens=max_new))
            done[p["id"]] = {"id": p["id"], "prompt_ids": ids, "output": toks}
            with open(cache, "a") as f:
                f.write(json.dumps(done[p["id"]]) + "\n")
            print(f"  AR {p['id']}: {len(toks)} tokens in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        out.append(done[p["id"]])
    return out


def simulate(drafter, target, rec: dict, max_new: int) -> tuple[int, int, float, dict]:
    """(new tokens, steps, draft seconds, stats) of REST replayed against a known greedy output."""
    from specdemo.engine import DecodeState
    from specdemo.sampling import SamplingConfig
    from specdemo.tree import TreeBuffers

    prompt, truth = rec["prompt_ids"], rec["output"]
    state = DecodeState(list(prompt), len(prompt), max_new, SamplingConfig(), target)
    drafter.begin(state, None)
    steps, pos, draft_s = 0, 0, 0.0
    stats = {"nodes": 0, "empty": 0, "accepted": 0, "sizes": []}
    while pos < len(truth):
        t0 = time.perf_counter()
        tree = drafter.propose(state) if state.remaining > 1 else None
        draft_s += time.perf_counter() - t0
        acc = 0
        if tree is not None and len(tree):
            tree = tree.prune(max_depth=state.remaining - 1, max_nodes=64)
            buf = TreeBuffers.build(tree, 0)
            node = 0
            while pos + acc < len(truth) - 1 and (nxt := buf.children[node].get(truth[pos + acc])) is not None:
                node = nxt
                acc += 1
            stats["nodes"] += len(tree)
        else:
            stats["empty"] += 1
        stats["sizes"].append(len(tree) if tree is not None else 0)
        stats["accepted"] += acc
        new = truth[pos : pos + acc + 1]
        state.tokens.extend(new)
        pos += len(new)
        steps += 1
    return len(truth), steps, draft_s, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="humaneval", help="humaneval | chat | a JSONL path")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budgets", default="8,16,32")
    ap.add_argument("--mode", choices=("sim", "engine"), default="sim")
    ap.add_argument("--opt", action="append", default=[], help="drafter option key=value")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cost", choices=("measure", "none"), default="measure",
                    help="measure: per-step sizing on (the drafter's calibration against this machine's measured "
                         "cost curve, which also models the speedup); none: fixed trees")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from specdemo.drafters import make_drafter
    from specdemo.engine import GenerationConfig, run_to_end
    from specdemo.prompts import load_prompts
    from specdemo.target import load_target

    target = load_target()
    prompts = load_prompts(args.prompts)[: args.limit]
    tag = args.prompts if args.prompts in ("humaneval", "chat") else Path(args.prompts).stem
    recs = ar_outputs(target, prompts, args.max_new_tokens, tag)
    opts = dict(kv.split("=", 1) for kv in args.opt)
    opts = {k: _val(v) for k, v in opts.items()}
    from specdemo import budget as budget_mod

    opts.setdefault("dynamic", args.cost == "measure")
    model_cost = budget_mod.relative_cost(budget_mod.verify_cost_curve(target, budget_mod.CURVE_SIZES))
    results = {}
    for budget in [int(b) for b in args.budgets.split(",")]:
        tot_new = tot_steps = 0
        draft_ms, per_prompt = [], []
        agg = {"nodes": 0, "empty": 0, "accepted": 0, "cost": 0.0}
        identical = 0
        for rec in recs:
            drafter = make_drafter("rest", target, budget=budget, **dict(opts))
            if args.mode == "sim":
                new, steps, ds, st = simulate(drafter, target, rec, args.max_new_tokens)
                for k in ("nodes", "empty", "accepted"):
                    agg[k] += st[k]
                agg["cost"] += sum(budget_mod.cost_at(model_cost, n) for n in st["sizes"])
                identical += 1
            else:
                toks, events = run_to_end(target, rec["prompt_ids"], drafter,
                                          GenerationConfig(max_new_tokens=args.max_new_tokens))
                identical += toks == rec["output"]
                new, steps, ds = len(toks), len(events), sum(e.draft_s for e in events[1:])
                agg["nodes"] += sum(e.tree_size for e in events)
                agg["empty"] += sum(e.tree_size == 0 for e in events)
                agg["accepted"] += sum(e.accepted for e in events)
                agg["cost"] += sum(budget_mod.cost_at(model_cost, e.tree_size) for e in events)
            tot_new += new
            tot_steps += steps
            draft_ms.append(1e3 * ds / max(steps, 1))
            per_prompt.append(new / steps)
        tau = tot_new / tot_steps
        speed = tot_new / agg["cost"]
        results[budget] = {"tau": round(tau, 3), "modelled_speedup": round(speed, 3), "steps": tot_steps, "new_tokens": tot_new,
                           "mean_nodes": round(agg["nodes"] / tot_steps, 1),
                           "empty_steps": round(agg["empty"] / tot_steps, 3),
                           "draft_ms_per_step": round(statistics.median(draft_ms), 3),
                           "identical": f"{identical}/{len(recs)}" if args.mode == "engine" else "n/a (sim)"}
        print(f"{args.prompts}[:{len(recs)}] budget {budget:3d} {args.mode}: tau {tau:.3f}, modelled speedup "
              f"{speed:.3f}  ({tot_new} tokens / "
              f"{tot_steps} steps; {agg['nodes'] / tot_steps:.1f} nodes/step, {agg['empty'] / tot_steps:.0%} empty "
              f"steps; draft {statistics.median(draft_ms):.3f} ms/step"
              f"{f'; identical {identical}/{len(recs)}' if args.mode == 'engine' else ''}) {opts}",
              flush=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
