"""The benchmark: every method on the same prompts, back to back, in one process, after a warm-up.

Speed is only ever reported as measured here, side by side: speedup = method tokens/s ÷ `ar` tokens/s of the same
run.  tau = new tokens ÷ target forwards (AR = 1.00, the bonus token counted, as Spec-Bench does).  identical = share
of prompts whose tokens equal AR's.  `hf` / `hf-pld` / `hf-static` are transformers' own `generate` (greedy or
sampling; `prompt_lookup_num_tokens=10`; a static KV cache, which on a GPU makes `generate` compile its decoding step
with CUDA graphs, transformers' fastest plain decoding) on the same inputs and the fp32 model whatever `--precision`
loaded, as outside reference points; `llamacpp` / `llamacpp-pld` are llama.cpp on the embedded GGUF (peers.py, `make peers`).

Every mode prefills a prompt with the same one forward, and a long prompt's prefill takes a large share of a 64-token
run (Spec-Bench's summaries and RAG passages: ~700 tokens).  A line under the table says how large, and each mode's
speedup on the decoding alone (`decode_speedup`: tokens/s over the time after the prefill, against AR's).

Prompts that carry a `group` (the Spec-Bench tasks) are also summarised per group, with the same formulas over that
group's prompts only, because an average over tasks hides where a drafter wins and where it costs time.

A method that leaves AR's tokens on a prompt is listed under the table with the token where it parts and AR's top-2
logit gap there (`per_prompt[].first_difference`, `tie_gap` in the JSON): a near-tie flipped by other kernels or by
another precision reads as a gap of a few hundredths, a bug as a large one.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable

import torch

from specdemo.budget import cost_curves, measure_cost_curves, pin_cost_curves
from specdemo.drafters import METHODS, make_drafter
from specdemo.engine import GenerationConfig, generate
from specdemo.peers import PEER_METHODS, run_peer
from specdemo.metrics import acceptance_by_depth, figures, first_difference, gap_at, runs_tokens_per_s, tokens_per_s
from specdemo.prompts import has_groups, load_prompts, stratified
from specdemo.sampling import SamplingConfig
from specdemo.target import Target, add_target_args, load_target, target_from_args

HF_METHODS = ("hf", "hf-pld", "hf-static")
STATIC_CACHE_STEP = 1024  # hf-static's cache length: prompt + new tokens rounded up to this, so compiled shapes repeat


def run_one(target: Target, method: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig,
            options: dict | None = None) -> dict:
    """One method on one prompt: tokens, wall time, accepted lengths, per-step draft/verify times."""
    if method in HF_METHODS:
        return _run_hf(target, method, prompt_ids, max_new_tokens, sampling)
    if method in PEER_METHODS:
        return run_peer(target, method, prompt_ids, max_new_tokens, sampling)
    drafter = make_drafter(method.split(":")[0], target, **(options or {}))  # "s4c:chain" = a labelled variant
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling)
    tokens, accept, draft, verify, margins, prefill = [], [], [], [], [], 0.0
    target.sync()
    t0 = time.perf_counter()
    for ev in generate(target, prompt_ids, drafter, cfg):
        tokens += ev.tokens
        accept.append(len(ev.tokens))
        draft.append(ev.draft_s)
        verify.append(ev.verify_s)
        margins += ev.margins
        prefill += ev.prefill_s
    target.sync()
    return {"tokens": tokens, "wall_time": time.perf_counter() - t0, "accept_lengths": accept,
            "draft_s": draft, "verify_s": verify, "margins": margins, "prefill_s": prefill}


def reference_model(target: Target) -> Target:
    """The model the `hf` rows run: the target itself, or at bf16/int4 the same model in fp32 (loaded once and kept
    on the target), because transformers' `generate` on the checkpoint's own weights is the outside reference point
    every precision is compared with."""
    if getattr(target, "precision", "fp32") == "fp32":
        return target
    if "fp32 reference" not in target.artifacts:
        target.artifacts["fp32 reference"] = load_target(target.name, str(target.device))
    return target.artifacts["fp32 reference"]


@torch.no_grad()
def _run_hf(target: Target, method: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig) -> dict:
    target = reference_model(target)
    ids = torch.tensor([prompt_ids], device=target.device)
    kw: dict = dict(max_new_tokens=max_new_tokens, eos_token_id=sorted(target.eos_ids),
                    pad_token_id=target.tokenizer.pad_token_id or sorted(target.eos_ids)[0],
                    attention_mask=torch.ones_like(ids))
    if sampling.greedy:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        torch.manual_seed(sampling.seed)
        kw.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
    if method == "hf-pld":
        kw["prompt_lookup_num_tokens"] = 10
    if method == "hf-static":
        from transformers import StaticCache

        length = -(-(len(prompt_ids) + max_new_tokens) // STATIC_CACHE_STEP) * STATIC_CACHE_STEP
        kw["past_key_values"] = StaticCache(config=target.model.config, max_cache_len=length)
    target.sync()
    t0 = time.perf_counter()
    with target.lock:
        out = target.model.generate(ids, **kw)
    target.sync()
    return {"tokens": out[0, len(prompt_ids):].tolist(), "wall_time": time.perf_counter() - t0,
            "accept_lengths": [], "draft_s": [], "verify_s": []}


def run_bench(target: Target, methods: list[str], prompts: list[dict], max_new_tokens: int,
              sampling: SamplingConfig | None = None, options: dict[str, dict] | None = None,
              progress: Callable[[int, int, str, str], None] | None = None, warmup: bool = True) -> dict:
    """Run `methods` (AR is added first if missing) over `prompts` ({"id","prompt"} and an optional "group");
    returns the bench JSON (see module doc)."""
    sampling = sampling or SamplingConfig()
    methods = ["ar"] + [m for m in methods if m != "ar"]
    options = options or {}
    encoded = [(p["id"], target.encode_prompt(p["prompt"])) for p in prompts]
    groups = [p.get("group") for p in prompts]
    measure_cost_curves(target)  # before any run: no method's first step pays for it
    if warmup and encoded:
        for m in methods:  # one short run per method: allocator, kernels, datastore pages, cost curves
            run_one(target, m, encoded[0][1], min(16, max_new_tokens), sampling, options.get(m))
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    total = len(encoded) * len(methods)
    for i, (pid, ids) in enumerate(encoded):
        for j, m in enumerate(methods):
            if progress:
                progress(i * len(methods) + j, total, str(pid), m)
            r = run_one(target, m, ids, max_new_tokens, sampling, options.get(m))
            r["id"], r["group"] = pid, groups[i]
            runs[m].append(r)
    return summarise(target, methods, runs, max_new_tokens, sampling)


def summarise(target: Target, methods: list[str], runs: dict[str, list[dict]], max_new_tokens: int,
              sampling: SamplingConfig) -> dict:
    """The bench JSON from raw runs ({method: [{"id", "tokens", "wall_time", "accept_lengths", "draft_s",
    "verify_s"[, "group"]}]}, one entry per prompt, AR included).  `groups` is {group: {method: {"speedup", "tau",
    "tokens_per_s", "identical", "prompts"}}} over the prompts that carry a group, in first-seen order ({} if none)."""
    ar = {r["id"]: r["tokens"] for r in runs["ar"]}
    ar_margins = {r["id"]: r.get("margins", []) for r in runs["ar"]}
    ar_tps = runs_tokens_per_s(runs["ar"])
    out = {"device": _device_name(target), "model": target.name, "dtype": str(target.dtype).replace("torch.", ""),
           "precision": getattr(target, "precision", "fp32"),
           "max_new_tokens": max_new_tokens, "sampling": vars(sampling), "prompts": len(runs["ar"]), "methods": {},
           "groups": {}}
    for m in methods:
        rs = runs[m]
        draft = [s for r in rs for s in r["draft_s"]]
        verify = [s for r in rs for s in r["verify_s"]]
        diffs = [first_difference(ar[r["id"]], r["tokens"], complete=True) for r in rs]  # None: the same tokens
        same = [d is None for d in diffs]
        out["methods"][m] = {
            **{k: v for k, v in figures(rs, ar, ar_tps).items() if k != "prompts"},
            "draft_ms": 1e3 * statistics.median(draft) if draft else None,
            # the mean as well: a drafter that skips work on some steps (S4C's priced head calls) drafts in two modes
            "draft_ms_mean": 1e3 * statistics.fmean(draft) if draft else None,
            "verify_ms": 1e3 * statistics.median(verify) if verify else None,
            # a step's whole cost, the prefill spread over the steps: beside the medians above it shows what a step
            # spends outside drafting and verification (the engine's Python, host syncs), the GPU's breakdown
            "step_ms": 1e3 * sum(r["wall_time"] for r in rs) / len(verify) if verify else None,
            "decode_speedup": decode_speedup(rs, runs["ar"]),
            "acceptance_by_depth": acceptance_by_depth([a for r in rs for a in r["accept_lengths"]]),
            "per_prompt": [{"id": r["id"], "group": r.get("group"), "new_tokens": len(r["tokens"]),
                            "wall_time": r["wall_time"], "prefill_s": r.get("prefill_s"),
                            "accept_lengths": r["accept_lengths"], "identical": s,
                            "first_difference": d, "tie_gap": gap_at(ar_margins[r["id"]], d), "tokens": r["tokens"]}
                           for r, s, d in zip(rs, same, diffs)],
        }
    for g in dict.fromkeys(r.get("group") for r in runs["ar"] if r.get("group")):
        ar_g = runs_tokens_per_s([r for r in runs["ar"] if r.get("group") == g])
        out["groups"][g] = {m: figures([r for r in runs[m] if r.get("group") == g], ar, ar_g) for m in methods}
    out["cost_curves"] = cost_curves(target)  # what the drafters sized their drafts by (--cost-curves replays it)
    return out


def decode_speedup(runs: list[dict], ar_runs: list[dict]) -> float | None:
    """tokens/s over the time after each prompt's prefill, against AR's the same way; None where a run does not
    report its prefill (transformers', llama.cpp's).  Every mode prefills a prompt with the same one forward, so the
    prefill dilutes each speedup by how long the prompts are: this is the speedup of the decoding alone."""
    if any(r.get("prefill_s") is None for r in [*runs, *ar_runs]):
        return None
    rate = lambda rs: tokens_per_s(sum(len(r["tokens"]) for r in rs),  # noqa: E731
                                   sum(r["wall_time"] - r["prefill_s"] for r in rs))
    return rate(runs) / rate(ar_runs)


def prefill_line(result: dict, labels: dict[str, str] | None = None) -> str | None:
    """The prefill's share of AR's time and each mode's speedup on the decoding alone (modes named by `labels` where
    given), or None where AR's prefill is not recorded (older JSON)."""
    ar = result["methods"].get("ar", {}).get("per_prompt", [])
    if not ar or any(p.get("prefill_s") is None for p in ar):
        return None
    share = sum(p["prefill_s"] for p in ar) / sum(p["wall_time"] for p in ar)
    alone = ", ".join(f"{(labels or {}).get(m, m)} {r['decode_speedup']:.2f}x" for m, r in result["methods"].items()
                      if m != "ar" and r.get("decode_speedup") is not None)
    return (f"prefill: {100 * share:.0f}% of AR's time (one forward over the prompt, the same in every mode)"
            + (f"; speedup of the decoding alone: {alone}" if alone else ""))


def _device_name(target: Target) -> str:
    if target.device.type == "cuda":
        return torch.cuda.get_device_name(target.device)
    kernels = ", oneDNN packed linears" if target.packed_linears else ""
    model = _cpu_model()
    return f"cpu{' ' + model if model else ''} ({torch.get_num_threads()} threads{kernels})"


def _cpu_model() -> str:
    """The processor's name as the kernel reports it (speedups depend on it: the tables say which CPU they are
    from); empty where /proc/cpuinfo is not there."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def format_table(result: dict) -> str:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    # precision is the CPU linears' setting; with fp32 linears the weights are in the model's dtype (bf16 on a GPU)
    precision = result.get("precision", "fp32")
    weights = precision if precision != "fp32" or result["dtype"] == "float32" else result["dtype"]
    lines = [f"model {result['model']} ({weights}) on {result['device']}, {result['prompts']} prompts, "
             f"max_new_tokens {result['max_new_tokens']}, "
             + ("greedy" if result["sampling"]["temperature"] <= 0 else f"sampling {result['sampling']}"),
             f"{'method':<12} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'identical':>9} {'draft ms':>9} {'verify ms':>9}"]
    for m, r in result["methods"].items():
        lines.append(f"{m:<12} {fmt(r['tokens_per_s'], '8.2f')} {fmt(r['speedup'], '8.2f')} {fmt(r['tau'], '6.2f')} "
                     f"{fmt(r['identical'], '9.2f')} {fmt(r['draft_ms'], '9.2f')} {fmt(r['verify_ms'], '9.2f')}")
    lines += difference_lines(result)
    lines += [line] if (line := prefill_line(result)) else []
    rows = group_rows(result)
    if rows:
        methods = list(result["methods"])
        widths = [max(len("group"), *(len(g) for g, _, _ in rows))] + \
                 [max(len(m), *(len(cells[i]) for _, _, cells in rows)) for i, m in enumerate(methods)]
        lines += ["", "per group: speedup x / tau (same formulas over the group's prompts)",
                  " ".join([f"{'group':<{widths[0]}}"] + [f"{m:>{w}}" for m, w in zip(methods, widths[1:])])]
        for g, _, cells in rows:
            lines.append(" ".join([f"{g:<{widths[0]}}"] + [f"{c:>{w}}" for c, w in zip(cells, widths[1:])]))
    return "\n".join(lines)


def difference_lines(result: dict, shown: int = 3) -> list[str]:
    """Per method whose tokens left AR's on some prompt: how many, and the first few with the token where they part
    and AR's top-2 logit gap there (a few hundredths: a near-tie flipped by other kernels or precision)."""
    lines = []
    for m, r in result["methods"].items():
        differ = [p for p in r["per_prompt"] if not p["identical"]]
        if not differ:
            continue
        where = ", ".join(f"{p['id']} at token {p['first_difference']}"
                          + ("" if p.get("tie_gap") is None else f" (top-2 gap {p['tie_gap']:.3g})")
                          for p in differ[:shown])
        lines.append(f"  {m} differs from ar on {len(differ)} of {len(r['per_prompt'])} prompts: {where}"
                     + (", ..." if len(differ) > shown else ""))
    return lines


def group_rows(result: dict) -> list[tuple[str, int, list[str]]]:
    """(group, prompts, cells) per group and then "overall", a cell "1.23x/1.85" (speedup/tau, "-" where a method has
    no such figure, as the hf methods have no tau) per method; [] when the result has no groups."""
    if not result.get("groups"):
        return []
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    cell = lambda r: f"{fmt(r.get('speedup'), '.2f')}x/{fmt(r.get('tau'), '.2f')}" if r else "-"  # noqa: E731
    methods = list(result["methods"])
    rows = [(g, max((r["prompts"] for r in by_m.values()), default=0), [cell(by_m.get(m)) for m in methods])
            for g, by_m in result["groups"].items()]
    return rows + [("overall", result["prompts"], [cell(result["methods"][m]) for m in methods])]


def parse_options(items: list[str]) -> dict[str, dict]:
    """`--option rest.budget=16` -> {"rest": {"budget": 16}} (ints, floats, true/false parsed)."""
    out: dict[str, dict] = {}
    for item in items:
        key, _, value = item.partition("=")
        method, _, name = key.partition(".")
        if not name or not value:
            raise ValueError(f"--option expects METHOD.NAME=VALUE, got '{item}'")
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(value)
                    break
                except ValueError:
                    pass
        out.setdefault(method, {})[name] = value
    return out


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods side by side on a prompt set")
    add_target_args(p)
    p.add_argument("--methods", default="ar,pld",
                   help=f"comma list of {','.join(METHODS + HF_METHODS + PEER_METHODS)} (llamacpp*: `make peers`); "
                   "METHOD:LABEL runs a labelled variant (options via --option METHOD:LABEL.NAME=VALUE)")
    p.add_argument("--prompts", default="humaneval",
                   help="humaneval | chat | spec_bench | spec_bench:tune | spec_bench:check | PATH.jsonl "
                        "(tune: the half to measure while choosing defaults; check: the half for published tables)")
    p.add_argument("--limit", type=int, default=None,
                   help="the first N prompts (default 10); not combined with --per-group, which picks its own")
    p.add_argument("--per-group", type=int, default=0,
                   help="N prompts from each group (Spec-Bench task), spread evenly and deterministically "
                        "(0 = off); only for prompt sets with groups: spec_bench or a Spec-Bench JSONL")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--option", action="append", default=[], help="METHOD.NAME=VALUE drafter option, repeatable")
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.add_argument("--cost-curves", default=None, metavar="BENCH.json",
                   help="size drafts by the verify cost curves saved in an earlier bench JSON instead of measuring "
                        "them: replays that run's accept lengths exactly (greedy)")
    p.set_defaults(func=_cli)


def read_cost_curves(path: str) -> dict:
    """The verify cost curves saved in a bench JSON (`--cost-curves`): sizing trees by them replays that run."""
    with open(path) as f:
        curves = json.load(f).get("cost_curves")
    if not curves:
        raise ValueError(f"{path} holds no cost_curves (it is not a bench JSON of this version)")
    return curves


def select_prompts(prompts: list[dict], name: str, limit: int | None, per_group: int) -> list[dict]:
    """The CLI's choice of prompts: `per_group` from each group (stratified) when it is > 0, else the first `limit`
    (10 when None).  Checked before the model loads, so a wrong flag fails in a second, not after a download."""
    if per_group < 0:
        raise ValueError("--per-group must be 0 (off) or positive")
    if per_group:
        if limit is not None:
            raise ValueError("--limit and --per-group do not combine: --per-group N already picks N per group")
        if not has_groups(prompts):
            raise ValueError(f"--per-group needs a prompt set whose prompts have groups (--prompts spec_bench or a "
                             f"Spec-Bench JSONL); '{name}' has none, use --limit instead")
        return stratified(prompts, per_group)
    limit = 10 if limit is None else limit
    if limit <= 0:
        raise ValueError("--limit must be positive")
    return prompts[:limit]


def _cli(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    prompts = select_prompts(load_prompts(args.prompts), args.prompts, args.limit, args.per_group)
    if args.max_new_tokens <= 0:
        raise ValueError("--max-new-tokens must be positive")
    saved_curves = read_cost_curves(args.cost_curves) if args.cost_curves else None
    target = target_from_args(args)
    if saved_curves:
        pin_cost_curves(target, saved_curves)
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
    sampling.validate()

    def progress(i: int, n: int, pid: str, m: str) -> None:
        print(f"\r[{i + 1}/{n}] {pid} {m:<8}", end="", file=sys.stderr, flush=True)

    result = run_bench(target, methods, prompts, args.max_new_tokens, sampling, parse_options(args.option), progress)
    print("", file=sys.stderr)
    result["command"] = "python -m specdemo bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else [])
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
