"""Training S4C draft heads (`python -m specdemo train s4c`): the heads are specdemo/drafters/s4c/heads.py.

Training (§3.1.2) -- `python -m specdemo train s4c`
-----------------
Unrolled over the three heads with teacher-forced target features computed ONCE (kept fp16 on disk by
feature_store.py under `cache_root()/s4c-features`, memory-mapped while training).  Per head h and position t
(predicting an answer token):
    L_h = w_ce * CE(lm(g_{h,t}), y_{t+h+1}) + w_soft * CE(lm(g_{h,t}), softmax(lm(f_{t+h}))) + w_l1 * SmoothL1(g_{h,t}, f_{t+h})
and L = sum_h head_weight_h * L_h, where y_{t+h+1} = argmax lm(f_{t+h}) is the target's own greedy token (on the
self-distilled answers that is the next token itself; on extra text such as stdlib code it is what the target would
have said), and lm() scores the draft vocabulary.  The paper's text does not give its weights; these are w_ce = 0.1, w_soft = 1.0,
w_l1 = 1.0 (EAGLE's 1.0 feature / 0.1 token split, plus the soft-CE that directly trains greedy agreement) and head
weights 1.0 / 0.8 / 0.6 (deeper heads matter less: acceptance is multiplicative).  Gradients flow from later heads
into earlier ones through g.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specdemo.drafters.s4c.heads import (
    TRAINED_PROMPT,
    S4CHeads,
    load_heads,
    save_heads,
)
from specdemo.offline import corpus, feature_store, train_loop
from specdemo.offline.feature_store import FeatureStore
from specdemo.offline.s4c_data import batch_counts, build_draft_vocab, collate, read_records, valid_counts
from specdemo.offline.s4c_metrics import format_metrics, hits, hits_full, sum_metrics
from specdemo.target import load_target


# ---------------------------------------------------------------------------------------------------------- training
def unrolled_losses(heads: S4CHeads, ids: torch.Tensor, feats: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor,
                    weights=(0.1, 1.0, 1.0), head_weights=(1.0, 0.8, 0.6), noise: float = 0.0, topk: int = 3,
                    counts: list[int] | None = None, full_vocab: bool = False, head_inputs: str = "own"):
    """Loss and per-head metrics for a right-padded batch: ids (B, T), feats (B, T, d) target features.

    Each head's terms are sums over its valid positions divided by `counts[h]` (default: this batch's own counts,
    i.e. means).  A data-parallel process passes the counts of the whole global batch, so that the processes'
    gradients add up to the one-process gradient.

    full_vocab: also count hits against the target's choice over its whole vocabulary (`top1_full`, `chain_full`):
    the training label is its choice within the draft vocabulary, which a token outside that vocabulary never
    misses, so only these say how often a draft would be accepted.

    head_inputs: "own" (training-time test, as EAGLE-3 trains): head h > 1 reads head h - 1's output, as when drafting;
    "target" (teacher forcing, the ablation): the target feature that output imitates, which drafting never has."""
    if head_inputs not in ("own", "target"):
        raise ValueError(f"head_inputs must be 'own' or 'target', got {head_inputs!r}")
    counts, (B, T), dev = counts or valid_counts(lens, starts, heads.n_heads), ids.shape, feats.device
    w_lm = heads.lm_weight()  # (V', d)
    emb = heads.embed(ids).to(feats.dtype)
    pos = torch.arange(T, device=dev).unsqueeze(0).expand(B, T)
    t_idx = torch.arange(T, device=dev).unsqueeze(0)
    u = feats + noise * torch.randn_like(feats) * feats.std() if noise > 0 else feats
    total = feats.new_zeros(())
    metrics = []
    prev_ok = prev_full = None
    for h in range(heads.n_heads):
        k = h + 1
        emb_h = torch.zeros_like(emb)
        emb_h[:, : T - k] = emb[:, k:]
        g = heads.head(h, emb_h, u, pos)  # causal (mask None)
        u = g if head_inputs == "own" else _target_inputs(feats, k, heads.d, g.dtype)
        # position t predicts x_{t+k+1}, imitating f_{t+k}
        valid = (t_idx + k + 1 < lens.unsqueeze(1)) & (t_idx + k + 1 >= starts.unsqueeze(1))
        if not valid.any():
            metrics.append(None)
            continue
        b_i, t_i = valid.nonzero(as_tuple=True)
        gi = g[b_i, t_i]
        fi = feats[b_i, t_i + k, -heads.d :]  # the last hidden state (the features may carry more layers)
        logits = gi @ w_lm.T
        with torch.no_grad():
            tlogits = fi @ w_lm.T
            soft = tlogits.softmax(-1)
            # label = the target's own greedy choice (within the draft vocab): on self-distilled answers this is the
            # next token itself; on other text (stdlib code) it is what greedy decoding would have produced
            lab = tlogits.argmax(-1)
        logp = logits.log_softmax(-1)
        n = counts[h]
        ce = F.cross_entropy(logits, lab, reduction="sum") / n
        soft_ce = -(soft * logp).sum() / n
        l1 = F.smooth_l1_loss(gi, fi, reduction="sum") / (n * gi.shape[-1])
        loss_h = weights[0] * ce + weights[1] * soft_ce + weights[2] * l1
        total = total + head_weights[min(h, len(head_weights) - 1)] * loss_h
        m, prev_ok = hits(logits.detach(), lab, valid, prev_ok, topk)
        if full_vocab:
            m_full, prev_full = hits_full(_drafted_is_targets_choice(heads, logits, fi), valid, prev_full)
            m.update(m_full)
        metrics.append(dict(m, ce=ce.item(), soft=soft_ce.item(), l1=l1.item()))
    return total, metrics


def _target_inputs(feats: torch.Tensor, k: int, d: int, dtype) -> torch.Tensor:
    """Teacher forcing's input to the head after head k: f_{t+k} at position t (the last hidden state; zero past
    the end), the feature head k's output imitates."""
    u = torch.zeros(*feats.shape[:2], d, dtype=dtype, device=feats.device)
    u[:, : feats.shape[1] - k] = feats[:, k:, -d:].to(dtype)
    return u


@torch.no_grad()
def _drafted_is_targets_choice(heads: S4CHeads, logits: torch.Tensor, fi: torch.Tensor) -> torch.Tensor:
    """Per row: is the head's draft the target's choice over its whole vocabulary?"""
    return heads.draft_vocab[logits.argmax(-1)] == (fi @ heads.target.lm_head.weight.T).argmax(-1)


@torch.no_grad()
def evaluate(heads, records, feats, args, dev) -> dict:
    heads.eval()
    acc: list = []
    for i in range(0, len(records), args.batch_size):
        batch = records[i : i + args.batch_size]
        ids, ft, lens, starts = collate(batch, feats, torch.float32, dev)
        _, ms = unrolled_losses(heads, ids, ft, lens, starts, tuple(args.loss_weights), full_vocab=True)
        acc = sum_metrics(acc, ms)
    heads.train()
    return format_metrics(acc)


def _epoch_order(records: list[dict], batch_size: int, rng: random.Random) -> list[dict]:
    """A shuffled epoch, bucketed by length within chunks of 64 so that padded batches waste little."""
    order = list(records)
    rng.shuffle(order)
    order = [r for i in range(0, len(order), 64) for r in sorted(order[i : i + 64], key=lambda r: len(r["ids"]))]
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(chunks)
    return [r for c in chunks for r in c]


def _make_heads(args, target, records: list[dict], resumed: dict | None, log) -> S4CHeads:
    """Heads from the checkpoint being resumed, from trained heads (--init), or fresh over a draft vocabulary of the
    corpus' most frequent tokens."""
    init = load_heads(target, args.init) if args.init and resumed is None else None
    if resumed is not None:
        draft_vocab = resumed["model"]["draft_vocab"]
    elif init is not None and not args.new_vocab:
        draft_vocab = init.draft_vocab.cpu()
    else:
        special = sorted(target.eos_ids) + list(getattr(target.tokenizer, "all_special_ids", []) or [])
        draft_vocab = build_draft_vocab(records, args.draft_vocab, target.lm_head.weight.shape[0], special)
    if init is not None:  # the init's shape; --n-heads may add deeper heads to it
        args.n_heads, args.intermediate_size = max(args.n_heads, init.n_heads), init.intermediate_size
    heads = S4CHeads(target, args.n_heads, args.intermediate_size, draft_vocab, args.feature_layers).to(target.device)
    if init is not None and init.feature_layers and init.feature_layers != heads.feature_layers:
        raise ValueError(f"--init heads read layers {list(init.feature_layers)}: pass --feature-layers with those")
    if init is not None:
        # the draft vocabulary only picks rows of the target's LM head, so the weights carry over to a new one; heads
        # that read the last layer alone start fused heads whose projection passes the last layer through (its init)
        heads.load_state_dict({k: v.float() for k, v in init.state_dict().items() if k != "draft_vocab"},
                              strict=False)
        heads.copy_deepest(init.n_heads)
        log(f"initialised from the heads in {args.init}"
            + (f" (a new draft vocabulary of {len(draft_vocab)} tokens from --data)" if args.new_vocab else "")
            + (f" (+ a fusion of layers {list(heads.feature_layers)}, starting as the last layer alone)"
               if heads.feature_layers and not init.feature_layers else "")
            + (f" (heads {init.n_heads + 1}..{heads.n_heads} start as copies of head {init.n_heads})"
               if heads.n_heads > init.n_heads else ""))
    if resumed is not None:
        missing, unexpected = heads.load_state_dict(resumed["model"], strict=False)
        if [k for k in missing + unexpected if not k.startswith("rotary.")]:
            raise ValueError(f"{args.out}/checkpoint.pt holds heads of another shape (--n-heads, --intermediate-size, "
                             f"--feature-layers); pass the flags it was started with, or --no-resume")
    return heads.train()


def _final_heldout(heads, held: list[dict], feats, args, out: Path, log) -> None:
    """Held-out numbers on the shared split, overall and per prompt source, into the artifact's config.json."""
    dev = heads.lm_weight().device
    cfg = json.loads((out / "config.json").read_text())
    cfg["heldout"] = evaluate(heads, held, feats, args, dev)
    log(f"held-out final: {json.dumps(cfg['heldout'])}")
    for name, m in train_loop.heldout_by_source(held, lambda part: evaluate(heads, part, feats, args, dev)).items():
        cfg[f"heldout_{name}"] = m
        log(f"held-out final ({name}, {m['records']} records): {json.dumps(m)}")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


@dataclass
class _Data:
    """The corpus of a run: every record, the training part, the held-out sample, the answer tokens in all."""

    records: list[dict]
    train: list[dict]
    held: list[dict]
    answer_tokens: int


@dataclass
class _Run:
    """What a training run updates and checkpoints."""

    heads: S4CHeads
    opt: torch.optim.Optimizer
    rng: random.Random
    total_steps: int
    step: int = 0


def train(args) -> int:
    train_loop.seed_everything(args.seed, args.threads)
    ddp = train_loop.DataParallel()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = train_loop.run_log(out / "train_log.txt") if ddp.is_main else (lambda msg: None)
    command = train_loop.command_line()
    log(f"command: {command}" + (f" (data parallel over {ddp.world} processes)" if ddp.world > 1 else ""))
    clock = train_loop.Clock(args.minutes)  # the budget counts the feature extraction too
    target = load_target(args.model, device=ddp.device(args.device), dtype="float32")  # the CPU demo's features
    data = _read_data(args, log)
    if data is None:
        return 1
    ckpt = out / "checkpoint.pt"
    resumed = train_loop.load_checkpoint(ckpt) if args.resume else None
    total_steps = args.steps or args.epochs * math.ceil(len(data.train) / args.batch_size)
    if resumed is not None and not args.steps:
        total_steps = max(total_steps, resumed.get("total_steps", 0))
    feats = _features(args, target, (data.train if total_steps else []) + data.held, ddp, log)
    run = _start(args, target, data, resumed, total_steps, log)
    ddp.same_parameters(run.heads)
    if resumed is not None:
        log(f"resumed from {ckpt} at step {run.step}")
    log(f"heads: {sum(p.numel() for p in run.heads.parameters()) / 1e6:.2f} M params, draft vocab "
        f"{len(run.heads.draft_vocab)}, {total_steps} steps of {args.batch_size} sequences, lr {args.lr}")

    def checkpoint(final: bool = False) -> None:
        _save(run, args, data, out, command)
        log(f"{'final' if final else 'checkpoint'}: step {run.step}, heads saved to {out}")

    t_start = time.time()
    _optimise(run, args, data, feats, target.device, clock, checkpoint, log, ddp)
    ddp.finish()
    if not ddp.is_main:
        return 0
    checkpoint(final=True)
    if data.held:
        _final_heldout(run.heads, data.held, feats, args, out, log)
    log(f"done: {run.step} steps in {(time.time() - t_start) / 60:.1f} min")
    return 0


def _features(args, target, records: list[dict], ddp: train_loop.DataParallel, log) -> FeatureStore:
    """The records' target features, computed where the store lacks them (the processes share the parts out)."""
    layers = tuple(args.feature_layers)
    folder = feature_store.store_folder(target, args.max_prompt, args.max_len, layers, args.feature_cache)
    store = FeatureStore(folder, args.max_prompt, args.max_len)
    if ddp.world > 1:
        ddp.state.wait_for_everyone()
    feature_store.extract(target, records, store, layers, log, args.feature_batch_tokens, ddp.rank, ddp.world,
                          args.feature_part_records)
    if ddp.world > 1:
        ddp.state.wait_for_everyone()
        store.refresh()
    return store


def _read_data(args, log) -> _Data | None:
    """The records of --data, split by the one held-out split every trainer uses; None when there are none."""
    records = read_records(args.data, args.first)
    if not records:
        log("no training records found")
        return None
    train_recs, held = corpus.split_heldout(records)
    held = corpus.heldout_sample([r for r in held if len(r["ids"]) <= args.max_len], args.heldout_max)
    n_tok = sum(len(r["ids"]) - r["start"] for r in records)
    log(f"data: {len(records)} records ({len(train_recs)} train, {len(held)} held out), {n_tok} answer tokens, "
        f"{sum(len(r['ids']) for r in records)} tokens in all")
    return _Data(records, train_recs, held, n_tok)


def _start(args, target, data: _Data, resumed: dict | None, total_steps: int, log) -> _Run:
    """The heads and their optimizer, fresh or as the checkpoint left them (step and data order included)."""
    heads = _make_heads(args, target, data.train, resumed, log)
    opt = torch.optim.AdamW(list(heads.parameters()), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    run = _Run(heads, opt, random.Random(args.seed), total_steps)
    if resumed is not None:
        opt.load_state_dict(resumed["opt"])
        run.step = resumed["step"]
        run.rng.setstate(resumed["rng"])
    return run


def _save(run: _Run, args, data: _Data, out: Path, command: str) -> None:
    """The checkpoint (to resume from) and the heads artifact (to use), both in `out`."""
    train_loop.save_checkpoint(out / "checkpoint.pt", {"model": run.heads.state_dict(), "opt": run.opt.state_dict(),
                                                       "step": run.step, "rng": run.rng.getstate(),
                                                       "total_steps": run.total_steps})
    save_heads(run.heads, out, {"training": {"command": command, "step": run.step, "records": len(data.records),
                                             "answer_tokens": data.answer_tokens, "loss_weights": args.loss_weights,
                                             "max_prompt": args.max_prompt, "seed": args.seed,
                                             "head_inputs": args.head_inputs, "autocast": args.autocast}})


def _optimise(run: _Run, args, data: _Data, feats: FeatureStore, dev, clock: train_loop.Clock, checkpoint, log,
              ddp: train_loop.DataParallel) -> None:
    """Optimizer steps until the planned number or the time budget: shuffled, length-bucketed batches, the cosine
    schedule, running metrics every --log-every steps, held-out numbers every --eval-every, checkpoints every
    --ckpt-every (those three on the main process only)."""
    order: list[dict] = []
    t_start, tok_seen, acc = time.time(), 0, []
    bar = tqdm(total=run.total_steps, initial=run.step, desc="s4c", mininterval=5, file=sys.stderr,
               disable=not ddp.is_main)
    while run.step < run.total_steps:
        order = order or _epoch_order(data.train, args.batch_size, run.rng)
        batch, order = order[: args.batch_size], order[args.batch_size :]
        counts = batch_counts(batch, args.max_prompt, args.max_len, run.heads.n_heads)
        lr = train_loop.cosine_lr(run.step, args.lr, args.warmup, run.total_steps, budget_spent=clock.spent())
        run.opt.zero_grad(set_to_none=True)
        mine = ddp.share(batch)  # every process draws the same batch; each computes its share's loss terms
        if mine:
            ids, ft, lens, starts = collate(mine, feats, torch.float32, dev)
            bf16 = args.autocast == "bf16"
            with torch.autocast(torch.device(dev or "cpu").type, dtype=torch.bfloat16, enabled=bf16):
                loss, ms = unrolled_losses(run.heads, ids, ft, lens, starts, tuple(args.loss_weights),
                                           noise=args.noise, counts=counts, head_inputs=args.head_inputs)
            loss.backward()
            tok_seen += int((lens - starts).clamp_min(0).sum())
            acc = sum_metrics(acc, ms)
        ddp.sum_gradients(run.heads.parameters())
        train_loop.optimizer_step(run.opt, None, lr)
        run.step += 1
        bar.update(1)
        if run.step % args.log_every == 0 and acc:
            m, acc = format_metrics(acc), []
            log(f"step {run.step}/{run.total_steps} loss {float(loss):.3f} lr {lr:.2e} "
                f"{tok_seen / (time.time() - t_start):.0f} tok/s | "
                + " ".join(f"h{h + 1} top1 {m[k]['top1']:.3f} cond {m[k]['cond']:.3f}" for h, k in enumerate(m)))
        if ddp.is_main and data.held and run.step % args.eval_every == 0:
            log(f"held-out @ {run.step}: {json.dumps(evaluate(run.heads, data.held, feats, args, dev))}")
        if ddp.is_main and run.step % args.ckpt_every == 0:
            checkpoint()
        if ddp.any(clock.over()):
            log(f"time budget of {args.minutes} min reached")
            break
    bar.close()


def register_train(subparsers) -> None:
    p = subparsers.add_parser("s4c", help="train S4C draft heads for a target model (CPU or GPU)")
    p.add_argument("--model", default="embedded")
    p.add_argument("--data", nargs="+", default=["assets/corpus/selfdistill.jsonl.gz"],
                   help="self-distilled corpora (.jsonl.gz from `python -m specdemo distill`) or jsonl with 'ids'")
    p.add_argument("--first", type=int, nargs="+", default=[0], metavar="N",
                   help="records taken from the start of each --data file (one number per file, or one for all; "
                        "0 = all)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--n-heads", type=int, default=3)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the heads score: the corpus' most frequent")
    p.add_argument("--new-vocab", action="store_true",
                   help="with --init: choose the draft vocabulary afresh from --data instead of keeping the heads'")
    p.add_argument("--feature-layers", type=int, nargs="*", default=[], metavar="L",
                   help="decoder layers head 1 also reads, fused with the last hidden state (EAGLE-3), e.g. 2 15")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: --epochs over the data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minutes", type=float, default=0, help="stop (and save) this long after the start, features included; the lr decays to it")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--head-inputs", choices=("own", "target"), default="own",
                   help="what heads 2.. read in training: the previous head's output, as when drafting (training-time "
                        "test), or the target feature it imitates (teacher forcing, an ablation)")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="bf16: the heads' training forward and backward in bf16 autocast (fp32 weights and optimizer; "
                        "~2.8x the answer tokens/s on a CPU with native bf16)")
    p.add_argument("--noise", type=float, default=0.0, help="Gaussian noise on head 1's input features (x std)")
    p.add_argument("--loss-weights", type=float, nargs=3, default=[0.1, 1.0, 1.0], metavar=("CE", "SOFT", "L1"))
    p.add_argument("--max-prompt", type=int, default=TRAINED_PROMPT, help="prompt tokens kept before each answer")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--heldout-max", type=int, default=256, help="held-out records evaluated at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--init", default=None, help="start from these trained heads (folder or hub id) instead of scratch")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/checkpoint.pt when it exists (default)")
    p.add_argument("--feature-cache", default=None, help="folder for the stored target features")
    p.add_argument("--feature-batch-tokens", type=int, default=1024,
                   help="padded tokens per target forward while computing features")
    p.add_argument("--feature-part-records", type=int, default=feature_store.PART_RECORDS,
                   help="records per stored part of features (the unit of resuming and of sharing out work)")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(func=train)
