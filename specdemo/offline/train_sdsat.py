"""Training the SDSAT adapter (`python -m specdemo train sdsat`); the adapter is specdemo/drafters/sdsat/adapter.py.

Training (`python -m specdemo train sdsat`): the base model is frozen and the adapter is off at standard positions, so
the paper's clean-sequence CE term is a constant with zero gradient: it is neither computed nor optimised.  The mixed
term becomes: for a clean (self-distilled) sequence, one no-grad base forward builds its KV cache; then chains of L
adaptive tokens hung after sampled origins p (each chain attends to x_0..x_p and to its own earlier adaptive tokens,
exactly as at inference) are run with the adapter on; adaptive token j of the chain at p is trained with CE against
x_{p+j+1}, the original model's own greedy token.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from specdemo.drafters.sdsat.adapter import DEFAULT_TARGETS, SDSATAdapter, default_token_id, load_adapter
from specdemo.offline import corpus, train_loop
from specdemo.offline.sdsat_probes import build_probes, probe_logits_many
from specdemo.target import Target, load_target


# ====================================================================================================== training data
def split_records(paths: list[str | Path], heldout_max: int, max_seq: int) -> tuple[list, list]:
    """(training, held-out) records of self-distilled corpora: usable lengths only, held out by the one shared split
    (sharegpt.is_heldout_record); the held-out list alternates the ShareGPT and project records so both are seen."""
    recs = [r for r in corpus.read_records(paths)
            if len(r["answer_ids"]) >= 3 and len(r["prompt_ids"]) + len(r["answer_ids"]) <= max_seq]
    train, held = corpus.split_heldout(recs)
    return train, corpus.heldout_sample(held, heldout_max)


@torch.no_grad()
def evaluate(model, adapter: SDSATAdapter, records: list[dict], L: int, max_probes: int = 384,
             batch: int = 1) -> dict:
    """Held-out acceptance: per-depth top-1 hit of adaptive positions vs the original model's greedy tokens, and the
    mean run of consecutive hits from depth 1 (= accepted drafts per chain); `batch` sequences per forward."""
    hits = torch.zeros(L)
    counts = torch.zeros(L)
    top5 = torch.zeros(L)
    runs, loss_sum, n_tok = [], 0.0, 0
    drawn = []
    for r in records:
        seq = r["prompt_ids"] + r["answer_ids"]
        b = build_probes(seq, len(r["prompt_ids"]), L, 1.0, None, max_probes, adapter.token_id)
        if b is not None:
            drawn.append((seq, b))
    for k in range(0, len(drawn), batch):
        part = drawn[k : k + batch]
        outs = probe_logits_many(model, adapter, [s for s, _ in part], [b for _, b in part], grad=False, soft=False)
        for (_, b), (logits, _) in zip(part, outs):
            logits = logits.float()
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
            runs += _accepted_runs(org.tolist(), hit.tolist())
    c = counts.clamp_min(1)
    mean_run = sum(runs) / max(1, len(runs))
    return {"loss": loss_sum / max(1, n_tok), "tokens": int(n_tok),
            "top1_by_depth": [round(x, 4) for x in (hits / c).tolist()],
            "top5_by_depth": [round(x, 4) for x in (top5 / c).tolist()],
            "mean_accepted_run": round(mean_run, 4),
            "est_tau_fused": round(1 + mean_run, 3), "est_tau_paper": round((2 + mean_run) / 2, 3)}


def _accepted_runs(origins: list[int], hits: list[bool]) -> list[int]:
    """Per chain (rows grouped by origin, in order), its consecutive top-1 hits from depth 1."""
    runs, cur, run, alive = [], None, 0, True
    for o, h in zip(origins, hits):
        if o != cur:
            if cur is not None:
                runs.append(run)
            cur, run, alive = o, 0, True
        if alive and h:
            run += 1
        else:
            alive = False
    return runs + [run]


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
    batch: int = 1  # sequences per forward: a step's sequences go through in forwards of this many
    autocast: str = "none"  # "bf16": the chains' forward and backward in bf16 autocast (a GPU's fast path)
    rate: float = 0.3
    soft_weight: float = 0.0  # weight of the soft-label term (CE against the original model's distribution)
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


def _make_adapter(cfg: TrainConfig, target, resuming: bool, log) -> SDSATAdapter:
    """A fresh LoRA, or (--init, when not resuming) the given adapter's weights for this run's targets; a target the
    adapter lacks starts as a fresh LoRA, whose zero B leaves the start's predictions as they were."""
    adapter = SDSATAdapter(target.model, cfg.rank, cfg.alpha, cfg.targets, default_token_id(target.tokenizer),
                           init_seed=cfg.seed)
    if cfg.init and not resuming:
        start, _ = load_adapter(cfg.init, target)
        if (start.rank, start.alpha, start.token_id) != (adapter.rank, adapter.alpha, adapter.token_id):
            raise ValueError(f"--init {cfg.init}: its rank/alpha/token ({start.rank}/{start.alpha}/{start.token_id}) "
                             f"differ from this run's ({adapter.rank}/{adapter.alpha}/{adapter.token_id})")
        own = adapter.state_dict()  # a target the start lacks keeps its fresh entries; every key is still checked
        adapter.load_state_dict({**own, **{k: v for k, v in start.state_dict().items() if k in own}})
        shared = [t for t in adapter.targets if t in start.targets]
        fresh = [t for t in adapter.targets if t not in start.targets]
        log(f"initialised from the adapter in {cfg.init}" + (f" (its {', '.join(shared)} LoRA)"
                                                             if shared != list(start.targets) else "")
            + (f"; {', '.join(fresh)} start fresh" if fresh else ""))
    return adapter


def _draw_chains(cfg: TrainConfig, r: dict, rng: random.Random, token_id: int):
    """One clean sequence's adaptive chains (build_probes), drawn with the run's generator; None: nothing to train."""
    seq = r["prompt_ids"] + r["answer_ids"]
    return build_probes(seq, len(r["prompt_ids"]), cfg.L, cfg.rate, rng, cfg.max_probes, token_id)


def _chains_loss(model, adapter: SDSATAdapter, cfg: TrainConfig, drawn: list[tuple[dict, tuple]]) -> list[float]:
    """Back-propagate the adaptive-chain loss of the sequences in `drawn` ((record, chains) pairs, one forward of
    them all), each sequence's mean loss scaled for the step's average; returns those losses."""
    seqs = [r["prompt_ids"] + r["answer_ids"] for r, _ in drawn]
    chains = [b for _, b in drawn]
    dev = adapter.embedding.device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16"):
        outs = probe_logits_many(model, adapter, seqs, chains, grad=True, soft=cfg.soft_weight > 0)
    losses = []
    for (logits, soft), b in zip(outs, chains):
        logp = logits.float().log_softmax(-1)
        loss = F.nll_loss(logp, b[2].to(dev))
        if soft is not None:  # the original model's whole distribution, not only its greedy token
            loss = (1 - cfg.soft_weight) * loss - cfg.soft_weight * (soft * logp).sum(-1).mean()
        losses.append(loss)
    (torch.stack(losses).sum() / cfg.seqs_per_step).backward()
    return [x.item() for x in losses]


def _epoch(cfg: TrainConfig, rng: random.Random, log) -> tuple[list[dict], list[dict], list[dict]]:
    """(training records, held-out records, this epoch's shuffled order), read again at each epoch so that a run
    picks up the records a growing corpus (a distillation still running) gained meanwhile."""
    train_recs, held = split_records(cfg.data, cfg.heldout_max, cfg.max_seq)
    if not train_recs:
        raise ValueError(f"no usable training records in {cfg.data}")
    log(f"epoch start: {len(train_recs)} training records ({sum(len(r['answer_ids']) for r in train_recs)} answer "
        f"tokens), {len(held)} held out")
    order = list(train_recs)
    rng.shuffle(order)
    return train_recs, held, order


@dataclass
class _Progress:
    """What a checkpoint carries besides the weights and the optimizer."""

    step: int = 0
    seen_tokens: int = 0
    probe_tokens: int = 0
    history: list = field(default_factory=list)


@dataclass
class _Run:
    """One training run: the frozen model, the adapter and its optimizer, the data of the current epoch, progress."""

    cfg: TrainConfig
    target: Target
    adapter: SDSATAdapter
    opt: torch.optim.Optimizer
    out: Path
    log: Callable[[str], None]
    prog: _Progress = field(default_factory=_Progress)
    rng: random.Random = field(default_factory=random.Random)
    clock: train_loop.Clock = field(default_factory=train_loop.Clock)
    ddp: train_loop.DataParallel | None = None  # set by train(): the processes this run is shared out over
    train_recs: list = field(default_factory=list)
    held: list = field(default_factory=list)
    order: list = field(default_factory=list)

    def save(self, metrics: dict | None = None) -> None:
        """The checkpoint (to resume from) and the adapter artifact with its latest held-out numbers."""
        cfg, prog = self.cfg, self.prog
        train_loop.save_checkpoint(self.out / "checkpoint.pt", {
            "adapter": self.adapter.state_dict(), "opt": self.opt.state_dict(), **asdict(prog),
            "rng": self.rng.getstate(), "torch_rng": torch.get_rng_state(), "elapsed": self.clock.elapsed(),
            "config": asdict(cfg)})
        latest = next((dict(h["eval"], step=h["step"]) for h in reversed(prog.history) if "eval" in h), None)
        self.adapter.save(self.out, self.target.identity, self.target.model, {
            "L": cfg.L, "heldout": metrics or latest,
            "train": {"config": asdict(cfg), "step": prog.step, "seen_tokens": prog.seen_tokens,
                      "probe_tokens": prog.probe_tokens, "elapsed_s": round(self.clock.elapsed(), 1),
                      "data_records": len(self.train_recs)}})

    def heldout(self) -> dict:
        """Held-out acceptance now, recorded in the history and the log."""
        m = evaluate(self.target.model, self.adapter, self.held, self.cfg.L, batch=self.cfg.batch)
        self.prog.history.append({"step": self.prog.step, "eval": m})
        self.log(f"step {self.prog.step} held-out: {json.dumps(m)}")
        return m


def train(cfg: TrainConfig, resume: bool = False, log=print) -> dict:
    if not 0.0 <= cfg.soft_weight <= 1.0:
        raise ValueError(f"--soft-weight must be in 0..1 (0: the greedy token alone), got {cfg.soft_weight}")
    if cfg.batch < 1:
        raise ValueError(f"--batch must be at least 1 (sequences per forward), got {cfg.batch}")
    train_loop.seed_everything(cfg.seed, cfg.threads)
    ddp = train_loop.DataParallel()
    log = log if ddp.is_main else (lambda msg: None)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(cfg.model, ddp.device(cfg.device), cfg.dtype)
    target.model.requires_grad_(False)
    ckpt = out / "checkpoint.pt"
    resumed = train_loop.load_checkpoint(ckpt) if resume else None
    run = _start(cfg, target, out, resumed, log, ddp)
    ddp.same_parameters(run.adapter)
    if resumed is not None:
        log(f"resumed from {ckpt} at step {run.prog.step}")
    run.train_recs, run.held, run.order = _epoch(cfg, run.rng, log)
    log(f"adapter {sum(p.numel() for p in run.adapter.parameters()) / 1e6:.2f}M params; adaptive token id "
        f"{run.adapter.token_id}" + (f"; data parallel over {ddp.world} processes" if ddp.world > 1 else ""))
    if ddp.is_main and run.prog.step == 0 and run.held:
        run.heldout()
    _optimise(run)
    ddp.finish()
    if not ddp.is_main:
        return {"step": run.prog.step, "heldout": None, "out": str(out)}
    if run.clock.over():
        log(f"time budget of {cfg.minutes} min reached at step {run.prog.step}")
    final = _final_heldout(run)
    run.save(final)
    log(f"wrote {out} ({sum(f.stat().st_size for f in out.glob('*.safetensors')) / 1e6:.1f} MB of weights)")
    return {"step": run.prog.step, "heldout": final, "out": str(out)}


def _start(cfg: TrainConfig, target, out: Path, resumed: dict | None, log, ddp: train_loop.DataParallel) -> _Run:
    """The adapter and its optimizer, fresh or as the checkpoint left them (progress, clock and generators too)."""
    adapter = _make_adapter(cfg, target, resumed is not None, log)
    opt = torch.optim.AdamW(list(adapter.parameters()), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    run = _Run(cfg, target, adapter, opt, out, log, rng=random.Random(cfg.seed), clock=train_loop.Clock(cfg.minutes),
               ddp=ddp)
    if resumed is not None:
        adapter.load_state_dict(resumed["adapter"])
        opt.load_state_dict(resumed["opt"])
        run.prog = _Progress(resumed["step"], resumed["seen_tokens"], resumed["probe_tokens"], resumed["history"])
        run.clock.before = resumed.get("elapsed", 0.0)
        run.rng.setstate(resumed["rng"])
        torch.set_rng_state(resumed["torch_rng"])
    return run


def _optimise(run: _Run) -> None:
    """Optimizer steps until cfg.steps or the time budget: each step accumulates the adaptive-chain loss of
    cfg.seqs_per_step sequences, in forwards of cfg.batch (a new epoch re-reads the corpus), then the cosine
    schedule's step; the mean loss is logged every 5 steps, held-out numbers taken every eval_every, checkpoints
    saved every ckpt_every."""
    cfg, prog, log, ddp = run.cfg, run.prog, run.log, run.ddp
    win_loss, win_n, t_last = 0.0, 0, time.time()
    while prog.step < cfg.steps and not ddp.any(run.clock.over()):
        run.opt.zero_grad(set_to_none=True)
        mine = []  # this process's sequences and their chains; every process draws every sequence's chains, so
        for j in range(cfg.seqs_per_step):  # that their generators stay in step (process k trains k, k + N, ...)
            if not run.order:
                run.train_recs, run.held, run.order = _epoch(cfg, run.rng, log)
            r = run.order.pop()
            chains = _draw_chains(cfg, r, run.rng, run.adapter.token_id)
            if chains is None:
                continue
            prog.seen_tokens += len(r["prompt_ids"]) + len(r["answer_ids"])
            prog.probe_tokens += len(chains[0])
            if j % ddp.world == ddp.rank:
                mine.append((r, chains))
        losses = []
        for k in range(0, len(mine), cfg.batch):  # cfg.batch >= 1: train() refuses less
            losses += _chains_loss(run.target.model, run.adapter, cfg, mine[k : k + cfg.batch])
        step_loss, step_n = sum(losses), len(losses)
        ddp.sum_gradients(run.adapter.parameters())
        lr = train_loop.cosine_lr(prog.step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio, run.clock.spent())
        train_loop.optimizer_step(run.opt, None, lr)
        prog.step += 1
        win_loss, win_n = win_loss + step_loss / max(1, step_n), win_n + 1
        if prog.step % 5 == 0:
            log(f"step {prog.step}/{cfg.steps} loss {win_loss / win_n:.3f} lr {lr:.2e} tokens {prog.seen_tokens} "
                f"adaptive {prog.probe_tokens} ({(time.time() - t_last) / 5:.1f} s/step) "
                f"elapsed {run.clock.elapsed() / 60:.1f} min")
            prog.history.append({"step": prog.step, "loss": round(win_loss / win_n, 4)})
            win_loss, win_n, t_last = 0.0, 0, time.time()
        metrics = run.heldout() if ddp.is_main and run.held and prog.step % cfg.eval_every == 0 else None
        if ddp.is_main and prog.step % cfg.ckpt_every == 0:
            run.save(metrics)


def _final_heldout(run: _Run) -> dict | None:
    """The held-out numbers at the last step (taken now unless the last step took them), with the numbers per
    prompt source beside them; None without held-out records."""
    if not run.held:
        return None
    last = run.prog.history[-1] if run.prog.history else {}
    final = last["eval"] if last.get("step") == run.prog.step and "eval" in last else run.heldout()
    if final:
        final.update(train_loop.heldout_by_source(
            run.held, lambda part: evaluate(run.target.model, run.adapter, part, run.cfg.L, batch=run.cfg.batch)))
    return final


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
    for name in ("rank", "alpha", "lr", "warmup", "steps", "seqs_per_step", "batch", "heldout_max", "eval_every",
                 "ckpt_every", "seed", "threads", "max_seq"):
        p.add_argument("--" + name.replace("_", "-"), type=type(getattr(d, name)), default=getattr(d, name))
    p.add_argument("--rate", type=float, default=d.rate, help="fraction of answer positions that start a chain")
    p.add_argument("--soft-weight", type=float, default=d.soft_weight,
                   help="0..1: weight of CE against the original model's next-token distribution (the rest: its "
                        "greedy token)")
    p.add_argument("--autocast", choices=("none", "bf16"), default=d.autocast,
                   help="bf16: the chains' forward and backward in bf16 autocast (fp32 weights and optimizer; GPUs)")
    p.add_argument("--max-probes", type=int, default=d.max_probes, help="adaptive tokens per sequence at most")
    p.add_argument("--minutes", type=float, default=d.minutes, help="stop (and export) after this long; 0 = off")
    p.add_argument("--targets", default=",".join(d.targets),
                   help="comma list of the linear layers that get LoRA (fewer = cheaper probe rows at inference)")
    p.add_argument("--init", default=d.init, help="start from this adapter (folder or hub id), e.g. the shipped one")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.set_defaults(func=_train_cli)


def _train_cli(args) -> int:
    cfg = TrainConfig(**{k: getattr(args, k) for k in TrainConfig.__dataclass_fields__ if hasattr(args, k)})
    cfg.targets = [t.strip() for t in str(args.targets).split(",") if t.strip()]
    log = train_loop.run_log()
    log(f"command: {train_loop.command_line()}")
    train(cfg, resume=args.resume, log=log)
    return 0
