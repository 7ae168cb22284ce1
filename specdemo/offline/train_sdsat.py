"""Training the SDSAT adapter (`python -m specdemo train sdsat`); the adapter is specdemo/drafters/sdsat/adapter.py.

Training (`python -m specdemo train sdsat`): the base model is frozen and the adapter is off at standard positions, so
the paper's clean-sequence CE term is a constant with zero gradient: it is neither computed nor optimised.  The mixed
term becomes: for a clean (self-distilled) sequence, one no-grad base forward builds its KV cache; then chains of L
adaptive tokens hung after sampled origins p (each chain attends to x_0..x_p and to its own earlier adaptive tokens,
exactly as at inference) are run with the adapter on; adaptive token j of the chain at p is trained with CE against
x_{p+j+1}, the original model's own greedy token.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specdemo.drafters.sdsat.adapter import (
    DEFAULT_TARGETS,
    SDSATAdapter,
    default_token_id,
    load_adapter,
)
from specdemo.offline import corpus
from specdemo.offline.sharegpt import split_name


# ====================================================================================================== training data
def split_records(paths: list[str | Path], heldout_max: int, max_seq: int) -> tuple[list, list]:
    """(training, held-out) records of self-distilled corpora: usable lengths only, held out by the one shared split
    (sharegpt.is_heldout_record); the held-out list alternates the ShareGPT and project records so both are seen."""
    recs = [r for r in corpus.read_records(paths)
            if len(r["answer_ids"]) >= 3 and len(r["prompt_ids"]) + len(r["answer_ids"]) <= max_seq]
    train, held = corpus.split_heldout(recs)
    by_split = [[r for r in held if split_name(r["id"]) == name] for name in ("sharegpt", "project")]
    mixed = [r for pair in itertools.zip_longest(*by_split) for r in pair if r is not None]
    return train, mixed[:heldout_max]


def build_probes(seq: list[int], start: int, L: int, rate: float, rng: random.Random | None, max_probes: int,
                 token_id: int):
    """Adaptive chains for one clean sequence.

    Origins p in [start-1, len-3] (p = the last context token; start = prompt length) are picked with probability
    `rate` (every one when rng is None); the chain at p holds min(L, len-2-p) adaptive tokens at positions p+1.., and
    token j (1-based) is labelled x_{p+j+1}.  Returns (ids, positions, labels, depths, origins, ctx_len) with the
    chain rows in order, or None when there is nothing to train on.
    """
    n = len(seq)
    cand = list(range(max(0, start - 1), n - 2))
    if rng is not None:
        cand = [p for p in cand if rng.random() < rate]
    chains, total = [], 0
    for p in cand:
        m = min(L, n - 2 - p)
        if m <= 0:
            continue
        if total + m > max_probes:
            break
        chains.append((p, m))
        total += m
    if not chains:
        return None
    pos, lab, dep, org = [], [], [], []
    for p, m in chains:
        for j in range(1, m + 1):
            pos.append(p + j)
            lab.append(seq[p + j + 1])
            dep.append(j)
            org.append(p)
    ctx_len = max(p for p, _ in chains) + 1
    return ([token_id] * total, torch.tensor(pos), torch.tensor(lab), torch.tensor(dep), torch.tensor(org), ctx_len)


def probe_mask(positions: torch.Tensor, origins: torch.Tensor, ctx_len: int, dtype) -> torch.Tensor:
    """Additive (1, 1, N, ctx_len + N) mask: a chain row sees x_0..x_p and its own chain up to itself."""
    n = len(positions)
    allow_ctx = torch.arange(ctx_len)[None, :] <= origins[:, None]
    idx = torch.arange(n)
    allow_probe = (origins[:, None] == origins[None, :]) & (idx[None, :] <= idx[:, None])
    allow = torch.cat([allow_ctx, allow_probe], dim=1)
    mask = torch.zeros(1, 1, n, ctx_len + n, dtype=dtype)
    return mask.masked_fill_(~allow, torch.finfo(dtype).min)


def probe_logits(model, adapter: SDSATAdapter, seq: list[int], batch, grad: bool) -> torch.Tensor:
    """Logits (N, V) of the adaptive chains of `batch` (from build_probes) on clean sequence `seq`."""
    from transformers import DynamicCache

    ids, pos, _, _, org, ctx_len = batch
    decoder = model.get_decoder()
    dev = adapter.embedding.device
    cache = DynamicCache()
    with torch.no_grad():  # the frozen original model over the clean context (adapter off)
        decoder(input_ids=torch.tensor([seq[:ctx_len]], device=dev), past_key_values=cache, use_cache=True)
    mask = probe_mask(pos, org, ctx_len, adapter.embedding.dtype).to(dev)
    with torch.set_grad_enabled(grad), adapter.active(None):
        h = decoder(input_ids=torch.tensor([ids], device=dev), attention_mask=mask,
                    position_ids=pos.unsqueeze(0).to(dev), past_key_values=cache, use_cache=True).last_hidden_state[0]
    return model.get_output_embeddings()(h)


@torch.no_grad()
def evaluate(model, adapter: SDSATAdapter, records: list[dict], L: int, max_probes: int = 384) -> dict:
    """Held-out acceptance: per-depth top-1 hit of adaptive positions vs the original model's greedy tokens, and the
    mean run of consecutive hits from depth 1 (= accepted drafts per chain)."""
    hits = torch.zeros(L)
    counts = torch.zeros(L)
    top5 = torch.zeros(L)
    runs, loss_sum, n_tok = [], 0.0, 0
    for r in records:
        seq = r["prompt_ids"] + r["answer_ids"]
        b = build_probes(seq, len(r["prompt_ids"]), L, 1.0, None, max_probes, adapter.token_id)
        if b is None:
            continue
        logits = probe_logits(model, adapter, seq, b, grad=False).float()
        _, _, lab, dep, org, _ = b
        lab, dep = lab.to(logits.device), dep.to(logits.device)
        loss_sum += F.cross_entropy(logits, lab, reduction="sum").item()
        n_tok += len(lab)
        hit = logits.argmax(-1) == lab
        in5 = (logits.topk(5, dim=-1).indices == lab[:, None]).any(-1)
        for d in range(1, L + 1):
            sel = dep == d
            hits[d - 1] += hit[sel].sum().item()
            top5[d - 1] += in5[sel].sum().item()
            counts[d - 1] += sel.sum().item()
        cur_org, run, alive = None, 0, True
        for o, h in zip(org.tolist(), hit.tolist()):
            if o != cur_org:
                if cur_org is not None:
                    runs.append(run)
                cur_org, run, alive = o, 0, True
            if alive and h:
                run += 1
            else:
                alive = False
        runs.append(run)
    c = counts.clamp_min(1)
    mean_run = sum(runs) / max(1, len(runs))
    return {"loss": loss_sum / max(1, n_tok), "tokens": int(n_tok),
            "top1_by_depth": [round(x, 4) for x in (hits / c).tolist()],
            "top5_by_depth": [round(x, 4) for x in (top5 / c).tolist()],
            "mean_accepted_run": round(mean_run, 4),
            "est_tau_fused": round(1 + mean_run, 3), "est_tau_paper": round((2 + mean_run) / 2, 3)}


@dataclass
class TrainConfig:
    model: str = "embedded"
    data: list = field(default_factory=lambda: ["assets/corpus/selfdistill.jsonl.gz"])
    out: str = "runs/sdsat"
    L: int = 5
    rank: int = 16
    alpha: float = 16.0
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 20
    steps: int = 400
    seqs_per_step: int = 2
    rate: float = 0.3
    max_probes: int = 320
    heldout_max: int = 32
    eval_every: int = 50
    ckpt_every: int = 25
    minutes: float = 0.0
    seed: int = 0
    threads: int = 1
    max_seq: int = 512
    init: str = ""  # start from this adapter (folder or hub id) instead of a fresh LoRA
    targets: list = field(default_factory=lambda: list(DEFAULT_TARGETS))
    device: str | None = None  # default: cuda when present
    dtype: str = "float32"  # the base model's weights, as the CPU demo runs them


def _lr_at(cfg: TrainConfig, step: int, elapsed_min: float = 0.0) -> float:
    """Linear warmup, then cosine to min_lr_ratio * lr over the steps -- or over the time budget when --minutes is
    set (CPU speed on a shared machine is unpredictable, so the schedule follows the clock)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.minutes:
        t = min(1.0, elapsed_min / cfg.minutes)
    else:
        t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(cfg: TrainConfig, resume: bool = False, log=print) -> dict:
    from specdemo.target import load_target

    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(cfg.model, cfg.device, cfg.dtype)
    model = target.model
    model.requires_grad_(False)
    token_id = default_token_id(target.tokenizer)
    adapter = SDSATAdapter(model, cfg.rank, cfg.alpha, cfg.targets, token_id, init_seed=cfg.seed)
    if cfg.init and not (resume and (out / "checkpoint.pt").exists()):
        start, _ = load_adapter(cfg.init, target)
        if (start.rank, start.alpha, start.token_id) != (adapter.rank, adapter.alpha, adapter.token_id) \
                or not set(adapter.targets) <= set(start.targets):
            raise ValueError(f"--init {cfg.init}: rank/alpha/token differ from this run's settings, or it lacks some "
                             f"of the targets {list(adapter.targets)} (it has {list(start.targets)})")
        own = adapter.state_dict()
        adapter.load_state_dict({k: v for k, v in start.state_dict().items() if k in own})
        log(f"initialised from the adapter in {cfg.init}" + (f" (its {', '.join(adapter.targets)} LoRA only)"
                                                             if adapter.targets != start.targets else ""))
    params = [p for p in adapter.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, seen_tokens, probe_tokens, history, elapsed_before = 0, 0, 0, [], 0.0
    rng = random.Random(cfg.seed)
    ckpt = out / "checkpoint.pt"
    if resume and ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        adapter.load_state_dict(st["adapter"])
        opt.load_state_dict(st["opt"])
        step, seen_tokens, probe_tokens, history = st["step"], st["seen_tokens"], st["probe_tokens"], st["history"]
        elapsed_before = st.get("elapsed", 0.0)
        rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"])
        log(f"resumed from {ckpt} at step {step}")

    def load_split():
        return split_records(cfg.data, cfg.heldout_max, cfg.max_seq)

    train_recs, held = load_split()
    if not train_recs:
        raise ValueError(f"no usable training records in {cfg.data}")
    log(f"data: {len(train_recs)} training records ({sum(len(r['answer_ids']) for r in train_recs)} answer tokens), "
        f"{len(held)} held out; adapter {sum(p.numel() for p in params) / 1e6:.2f}M params; "
        f"adaptive token id {token_id}")
    order: list[dict] = []
    t_start = time.time()

    def save(final: bool = False, metrics: dict | None = None):
        elapsed = elapsed_before + time.time() - t_start
        torch.save({"adapter": adapter.state_dict(), "opt": opt.state_dict(), "step": step,
                    "seen_tokens": seen_tokens, "probe_tokens": probe_tokens, "history": history,
                    "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "elapsed": elapsed,
                    "config": asdict(cfg)}, str(ckpt) + ".tmp")
        os.replace(str(ckpt) + ".tmp", ckpt)
        extra = {"L": cfg.L, "train": {"config": asdict(cfg), "step": step, "seen_tokens": seen_tokens,
                                       "probe_tokens": probe_tokens, "elapsed_s": round(elapsed, 1),
                                       "data_records": len(train_recs)},
                 "heldout": metrics or next((dict(h["eval"], step=h["step"]) for h in reversed(history)
                                             if "eval" in h), None)}
        adapter.save(out, target.identity, model, extra)

    if step == 0 and held:
        m = evaluate(model, adapter, held, cfg.L)
        history.append({"step": 0, "eval": m})
        log(f"step 0 held-out: {json.dumps(m)}")
    win_loss, win_n, t_last = 0.0, 0, time.time()
    while step < cfg.steps:
        elapsed_min = (elapsed_before + time.time() - t_start) / 60
        if cfg.minutes and elapsed_min >= cfg.minutes:
            log(f"time budget of {cfg.minutes} min reached at step {step}")
            break
        lr = _lr_at(cfg, step, elapsed_min)
        for gp in opt.param_groups:
            gp["lr"] = lr
        opt.zero_grad(set_to_none=True)
        step_loss, step_n = 0.0, 0
        for _ in range(cfg.seqs_per_step):
            if not order:  # new epoch: pick up records the growing corpus gained meanwhile
                train_recs, held = load_split()
                log(f"epoch start: {len(train_recs)} training records "
                    f"({sum(len(r['answer_ids']) for r in train_recs)} answer tokens), {len(held)} held out")
                order = list(train_recs)
                rng.shuffle(order)
            r = order.pop()
            seq = r["prompt_ids"] + r["answer_ids"]
            b = build_probes(seq, len(r["prompt_ids"]), cfg.L, cfg.rate, rng, cfg.max_probes, token_id)
            if b is None:
                continue
            logits = probe_logits(model, adapter, seq, b, grad=True)
            loss = F.cross_entropy(logits.float(), b[2].to(logits.device))
            (loss / cfg.seqs_per_step).backward()
            step_loss += loss.item()
            step_n += 1
            seen_tokens += len(seq)
            probe_tokens += len(b[0])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        win_loss += step_loss / max(1, step_n)
        win_n += 1
        if step % 5 == 0:
            dt = time.time() - t_last
            log(f"step {step}/{cfg.steps} loss {win_loss / win_n:.3f} lr {lr:.2e} tokens {seen_tokens} "
                f"adaptive {probe_tokens} ({dt / 5:.1f} s/step) elapsed {(time.time() - t_start) / 60:.1f} min")
            history.append({"step": step, "loss": round(win_loss / win_n, 4)})
            win_loss, win_n, t_last = 0.0, 0, time.time()
        metrics = None
        if held and step % cfg.eval_every == 0:
            metrics = evaluate(model, adapter, held, cfg.L)
            history.append({"step": step, "eval": metrics})
            log(f"step {step} held-out: {json.dumps(metrics)}")
        if step % cfg.ckpt_every == 0:
            save(metrics=metrics)
    final = evaluate(model, adapter, held, cfg.L) if held else None
    if final:
        history.append({"step": step, "eval": final})
        log(f"final held-out (step {step}): {json.dumps(final)}")
        for name in ("sharegpt", "project"):
            part = [r for r in held if split_name(r["id"]) == name]
            if part:
                final[name] = dict(evaluate(model, adapter, part, cfg.L), records=len(part))
                log(f"final held-out ({name}, {len(part)} records): {json.dumps(final[name])}")
    save(final=True, metrics=final)
    log(f"wrote {out} ({sum(f.stat().st_size for f in out.glob('*.safetensors')) / 1e6:.1f} MB of weights)")
    return {"step": step, "heldout": final, "out": str(out)}


# ====================================================================================================== CLI
def register_train(subparsers) -> None:
    d = TrainConfig()
    p = subparsers.add_parser("sdsat", help="train an SDSAT adapter (LoRA + adaptive token, active at adaptive "
                                            "positions only, so verification stays the original model's)")
    p.add_argument("--model", default=d.model, help="'embedded', a hub id or a local path")
    p.add_argument("--data", nargs="+", default=d.data, help="self-distilled corpora (gzip JSONL of prompt_ids/answer_ids)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--out", default=d.out, help="output folder (artifact + checkpoint.pt)")
    p.add_argument("--L", type=int, default=d.L, help="adaptive chain length in training (max draft depth)")
    p.add_argument("--rank", type=int, default=d.rank)
    p.add_argument("--alpha", type=float, default=d.alpha)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--seqs-per-step", type=int, default=d.seqs_per_step)
    p.add_argument("--rate", type=float, default=d.rate, help="fraction of answer positions that start a chain")
    p.add_argument("--max-probes", type=int, default=d.max_probes, help="adaptive tokens per sequence at most")
    p.add_argument("--heldout-max", type=int, default=d.heldout_max)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--minutes", type=float, default=d.minutes, help="stop (and export) after this long; 0 = off")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--max-seq", type=int, default=d.max_seq)
    p.add_argument("--targets", default=",".join(d.targets),
                   help="comma list of the linear layers that get LoRA (fewer = cheaper probe rows at inference)")
    p.add_argument("--init", default=d.init, help="start from this adapter (folder or hub id), e.g. the shipped one")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.set_defaults(func=_train_cli)


def _train_cli(args) -> int:
    cfg = TrainConfig(**{k: getattr(args, k) for k in TrainConfig.__dataclass_fields__ if hasattr(args, k)})
    cfg.targets = [t.strip() for t in str(args.targets).split(",") if t.strip()]

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    log("sdsat train: " + " ".join(sys.argv[1:]))
    train(cfg, resume=args.resume, log=log)
    return 0
