"""S4C draft model (He et al., "Speculative Sampling with Syntactic and Semantic Coherence"): heads, trees, training.

No public code exists; this is our reading of the paper (§3), with every vague point decided here.

Model (§3.1.1)
--------------
* Feature f_t = the target's final *normed* hidden state at position t (the LM head's input; it predicts x_{t+1}).
* Head h (h = 1..H, H = 3):  g_{h,t} = Norm_h(DecoderLayer_h(W_h [e(x_{t+h}); u_{h,t}] + b_h))
  with u_{1,t} = f_t (the target's feature) and u_{h,t} = g_{h-1,t} (the previous head's output): heads are
  *autoregressive between heads*.  g_{h,t} imitates f_{t+h} and predicts x_{t+h+1} through the target's frozen LM head;
  e() is the target's frozen embedding table.  DecoderLayer_h is the target's own decoder-layer class
  (`type(target.decoder.layers[0])`, e.g. LlamaDecoderLayer / Qwen2DecoderLayer) built from a copy of the target's
  config with a smaller MLP (`intermediate_size`, default 768, so three heads of SmolLM2-135M fit in < 20 MB fp16).
* Each head attends causally over its own positions t (its own KV cache).  Head h can take position t into its cache
  once x_{t+h} is committed, so head 1 runs up to the newest committed position, head 2 one behind, head 3 two behind.
  At drafting time head h fills the missing h-1 positions of each branch with draft tokens and the previous head's
  draft outputs ("parallel within a head": all branches of a depth go through ONE layer call with a tree mask;
  "autoregressive between heads": depth h needs depth h-1's outputs).  Inference therefore sees exactly the inputs
  the unrolled training saw (no train/test mismatch between target features and draft features).
* First head: only one target feature is available (the one of the token before the root); head 1's distribution
  gives the top-2 candidates a, b that start the two vertical chains (the paper's "reuse the feature, take the top-2
  candidates as different inputs"); heads 2 and 3 run on both chains batched and continue each with its top-1.
* Draft vocabulary (our addition, as FR-Spec/EAGLE-3): tokens are scored against a frequency-selected subset of the
  target's LM-head rows (the `draft_vocab` stored with the heads, default 8192) plus every token of the current
  prompt.  It cuts the soft-CE cost of training ~6x on CPU and the per-step draft cost; the LM head itself stays the
  target's frozen one.

Continuous verification tree (§3.2) -- `tree="s4c"` (default)
-----------------------------------
Vertical first: the two top-1 chains a→a2→a3 and b→b2→b3.  Then horizontal: at every chain position the top-2..top-k
alternatives of the same distribution (free: no extra head call).  Nodes are kept in that priority order (chains, then
alternatives by cumulative draft probability) up to `budget`; k = 3 gives 15 nodes.  Ablations over the same heads:
`tree="chain"` (one top-1 chain, H nodes) and `tree="eagle"` (EAGLE-2 style: at every depth expand the `topk` best
nodes by cumulative log-probability with their top-k children, then keep the `budget` best nodes overall).

Training (§3.1.2) -- `python -m specdemo train s4c`
-----------------
Unrolled over the three heads with teacher-forced target features computed ONCE (one target forward per sequence,
cached fp16 under `cache_root()/s4c-features`).  Per head h and position t (predicting an answer token):
    L_h = w_ce * CE(lm(g_{h,t}), y_{t+h+1}) + w_soft * CE(lm(g_{h,t}), softmax(lm(f_{t+h}))) + w_l1 * SmoothL1(g_{h,t}, f_{t+h})
and L = sum_h head_weight_h * L_h, where y_{t+h+1} = argmax lm(f_{t+h}) is the target's own greedy token (on the
self-distilled answers that is the next token itself; on extra text such as stdlib code it is what the target would
have said), and lm() scores the draft vocabulary.  The paper's weights were lost in the text we have; we use w_ce = 0.1, w_soft = 1.0,
w_l1 = 1.0 (EAGLE's 1.0 feature / 0.1 token split, plus the soft-CE that directly trains greedy agreement) and head
weights 1.0 / 0.8 / 0.6 (deeper heads matter less: acceptance is multiplicative).  Gradients flow from later heads
into earlier ones through g.
"""
from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .sharegpt import is_heldout_record, split_name

FORMAT = "specdemo-s4c"
VERSION = 1
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "s4c"
EMBEDDED_HEADS = ASSETS / "smollm2-135m-instruct"


class S4CArtifactError(RuntimeError):
    """Heads missing, unreadable, or trained for another target model; the message says what to do."""


# ---------------------------------------------------------------------------------------------------------- identity
def target_config_hash(target) -> str:
    cfg = target.model.config
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings")
    blob = json.dumps({k: getattr(cfg, k, None) for k in keys}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_command(target_name: str, out: str = "DIR") -> str:
    return f"python -m specdemo train s4c --model {target_name} --data assets/corpus/selfdistill.jsonl.gz --out {out}"


# ---------------------------------------------------------------------------------------------------------- model
class S4CHeads(nn.Module):
    """H heads: Linear(2d -> d) + one target-class decoder layer + RMSNorm each.  Embedding and LM head are the
    target's (frozen, not stored); `draft_vocab` is a buffer of token ids the heads score against."""

    def __init__(self, target, n_heads: int = 3, intermediate_size: int = 768, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        dec = target.decoder
        cfg = copy.deepcopy(target.model.config)
        cfg.num_hidden_layers = 1
        cfg.intermediate_size = intermediate_size
        cfg._attn_implementation = "sdpa"
        if hasattr(cfg, "layer_types"):
            cfg.layer_types = ["full_attention"]
        cfg.use_sliding_window = False
        d = cfg.hidden_size
        self.d, self.n_heads, self.intermediate_size = d, n_heads, intermediate_size
        layer_cls, norm_cls = type(dec.layers[0]), type(dec.norm)
        self.fc = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(n_heads))
        self.layers = nn.ModuleList(layer_cls(cfg, layer_idx=0) for _ in range(n_heads))
        self.norms = nn.ModuleList(norm_cls(d, eps=cfg.rms_norm_eps) for _ in range(n_heads))
        self.rotary = type(dec.rotary_emb)(config=cfg)
        std = getattr(cfg, "initializer_range", 0.02)
        for mod in self.layers.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=std)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
        with torch.no_grad():  # start as "pass the feature through": fc = [0 | I]
            for fc in self.fc:
                fc.weight.zero_()
                fc.weight[:, d:] = torch.eye(d)
                fc.bias.zero_()
            for norm in self.norms:
                norm.weight.copy_(dec.norm.weight.detach().float())
        if draft_vocab is None:
            draft_vocab = torch.arange(target.model.config.vocab_size)
        self.register_buffer("draft_vocab", draft_vocab.long().clone(), persistent=True)
        # frozen references to the target (not parameters of this module, never saved)
        self._target = [target]

    @property
    def target(self):
        return self._target[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.model.get_input_embeddings()(ids)

    def lm_weight(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        w = self.target.lm_head.weight
        return w[self.draft_vocab if ids is None else ids]

    def head(self, h: int, emb: torch.Tensor, feat: torch.Tensor, position_ids: torch.Tensor,
             mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Head h (0-based) over (B, T) positions: [e(x); u] -> features (B, T, d)."""
        x = self.fc[h](torch.cat([emb, feat], dim=-1))
        pe = self.rotary(x, position_ids)
        kw = dict(attention_mask=mask, position_ids=position_ids, position_embeddings=pe)
        if cache is not None:
            kw.update(past_key_values=cache, use_cache=True)
        y = self.layers[h](x, **kw)
        if isinstance(y, tuple):
            y = y[0]
        return self.norms[h](y)

    def artifact_state(self) -> dict[str, torch.Tensor]:
        sd = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()
              if not k.startswith("rotary.") and k != "draft_vocab"}
        sd["draft_vocab"] = self.draft_vocab.to(torch.int32).contiguous()
        return sd


def save_heads(heads: S4CHeads, out: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t = heads.target
    cfg = {
        "format": FORMAT, "version": VERSION, "n_heads": heads.n_heads, "hidden_size": heads.d,
        "intermediate_size": heads.intermediate_size, "draft_vocab_size": int(heads.draft_vocab.numel()),
        "target": t.name, "tokenizer_identity": t.identity, "target_config_hash": target_config_hash(t),
        "target_model_type": t.model.config.model_type,
    }
    cfg.update(extra or {})
    tmp = out / "model.safetensors.tmp"
    save_file(heads.artifact_state(), str(tmp), metadata={"format": FORMAT})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def resolve_heads_dir(source: str | Path) -> Path:
    """A local folder, or a hub repo id fetched with huggingface_hub (fails clearly offline)."""
    p = Path(source).expanduser()
    if p.exists():
        if not (p / "config.json").exists() or not (p / "model.safetensors").exists():
            raise S4CArtifactError(f"S4C heads folder {p} has no config.json + model.safetensors.")
        return p
    if str(source).count("/") != 1 or str(source).startswith((".", "/", "~")):
        raise S4CArtifactError(f"S4C heads '{source}' not found: not a local folder and not a hub repo id (owner/name).")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=str(source), allow_patterns=["config.json", "model.safetensors", "*.md"]))
    except Exception as exc:  # offline, missing repo, auth ...
        raise S4CArtifactError(f"Cannot fetch S4C heads '{source}' from the Hugging Face hub "
                               f"({type(exc).__name__}: {str(exc)[:200]}). Pass a local folder instead.") from exc


def load_heads(target, source: str | Path) -> S4CHeads:
    from safetensors.torch import load_file

    path = resolve_heads_dir(source)
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("format") != FORMAT:
        raise S4CArtifactError(f"{path} is not an S4C heads folder (format {cfg.get('format')!r}).")
    if cfg.get("tokenizer_identity") != target.identity or cfg.get("target_config_hash") != target_config_hash(target):
        raise S4CArtifactError(
            f"The S4C heads in {path} were trained for another model ({cfg.get('target')!r}, tokenizer "
            f"{cfg.get('tokenizer_identity')}, config {cfg.get('target_config_hash')}), not for '{target.name}' "
            f"(tokenizer {target.identity}, config {target_config_hash(target)}). Train heads for this model: "
            f"{train_command(target.name)}")
    sd = load_file(str(path / "model.safetensors"))
    heads = S4CHeads(target, cfg["n_heads"], cfg["intermediate_size"], sd.pop("draft_vocab").long())
    missing, unexpected = heads.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.") and k != "draft_vocab"]
    if missing or unexpected:
        raise S4CArtifactError(f"S4C heads in {path} do not match the model layout (missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}).")
    heads.to(device=target.device, dtype=target.dtype)
    heads.eval().requires_grad_(False)
    heads.config = cfg
    return heads


# ---------------------------------------------------------------------------------------------------------- data
def read_records(paths: list[str]) -> list[dict]:
    """Records {"id", "ids", "start"} (start = first answer position) from self-distilled corpora (.jsonl[.gz] with
    prompt_ids/answer_ids, the corpus format of `python -m specdemo distill`) or plain {"ids": [...]} jsonl."""
    out = []
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                r = json.loads(line)
                if "format" in r and "prompt_ids" not in r and "ids" not in r:
                    continue  # header
                if "prompt_ids" in r:
                    ids, start = list(r["prompt_ids"]) + list(r["answer_ids"]), len(r["prompt_ids"])
                else:
                    ids, start = list(r["ids"]), int(r.get("start", 1))
                if len(ids) - start < 4:
                    continue
                out.append({"id": f"{Path(path).name}:{r.get('id', n)}", "key": str(r.get("id", n)), "ids": ids,
                            "start": start})
    return out


def _rec_key(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:20]


@torch.no_grad()
def extract_features(target, records: list[dict], cache_file: Path, max_prompt: int, log=print) -> dict[str, torch.Tensor]:
    """Teacher-forced target features (fp16) of every record, one target forward per record, cached on disk."""
    feats: dict[str, torch.Tensor] = {}
    if cache_file.exists():
        try:
            feats = torch.load(cache_file)
        except Exception:
            feats = {}
    todo = [r for r in records if _rec_key(r["ids"]) not in feats]
    if todo:
        log(f"features: {len(records) - len(todo)} cached, computing {len(todo)} "
            f"({sum(len(r['ids']) for r in todo)} tokens) ...")
    t0, done_tok, last_save = time.time(), 0, time.time()
    for i, r in enumerate(todo):
        ids = torch.tensor([r["ids"]], device=target.device)
        h = target.decoder(input_ids=ids).last_hidden_state[0]
        feats[_rec_key(r["ids"])] = h.to(torch.float16).cpu()
        done_tok += len(r["ids"])
        if time.time() - last_save > 120 or i == len(todo) - 1:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(feats, str(cache_file) + ".tmp")
            os.replace(str(cache_file) + ".tmp", cache_file)
            last_save = time.time()
            log(f"features: {i + 1}/{len(todo)} records, {done_tok / (time.time() - t0):.0f} tok/s")
    return feats


def build_draft_vocab(records: list[dict], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        counts.index_add_(0, torch.tensor(r["ids"]), torch.ones(len(r["ids"]), dtype=torch.long))
    counts[torch.tensor([t for t in always if 0 <= t < vocab_size], dtype=torch.long)] += 10 ** 9
    k = min(size, vocab_size)
    top = torch.topk(counts, k).indices
    top = top[counts[top] > 0] if (counts > 0).sum() >= 16 else top
    return torch.sort(top).values


# ---------------------------------------------------------------------------------------------------------- training
def unrolled_losses(heads: S4CHeads, ids: torch.Tensor, feats: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor,
                    weights=(0.1, 1.0, 1.0), head_weights=(1.0, 0.8, 0.6), noise: float = 0.0, topk: int = 3):
    """Loss and per-head metrics for a right-padded batch: ids (B, T), feats (B, T, d) target features."""
    B, T = ids.shape
    dev = feats.device
    vocab = heads.draft_vocab
    w_lm = heads.lm_weight()  # (V', d)
    emb = heads.embed(ids).to(feats.dtype)
    pos = torch.arange(T, device=dev).unsqueeze(0).expand(B, T)
    t_idx = torch.arange(T, device=dev).unsqueeze(0)
    u = feats + noise * torch.randn_like(feats) * feats.std() if noise > 0 else feats
    total = feats.new_zeros(())
    metrics = []
    prev_ok = None
    for h in range(heads.n_heads):
        k = h + 1
        emb_h = torch.zeros_like(emb)
        emb_h[:, : T - k] = emb[:, k:]
        g = heads.head(h, emb_h, u, pos)  # causal (mask None)
        u = g
        # position t predicts x_{t+k+1}, imitating f_{t+k}
        valid = (t_idx + k + 1 < lens.unsqueeze(1)) & (t_idx + k + 1 >= starts.unsqueeze(1))
        if not valid.any():
            metrics.append(None)
            continue
        b_i, t_i = valid.nonzero(as_tuple=True)
        gi = g[b_i, t_i]
        fi = feats[b_i, t_i + k]
        logits = gi @ w_lm.T
        with torch.no_grad():
            tlogits = fi @ w_lm.T
            soft = tlogits.softmax(-1)
            # label = the target's own greedy choice (within the draft vocab): on self-distilled answers this is the
            # next token itself; on other text (stdlib code) it is what greedy decoding would have produced
            lab = tlogits.argmax(-1)
        logp = logits.log_softmax(-1)
        ce = F.cross_entropy(logits, lab)
        soft_ce = -(soft * logp).sum(-1).mean()
        l1 = F.smooth_l1_loss(gi, fi)
        loss_h = weights[0] * ce + weights[1] * soft_ce + weights[2] * l1
        total = total + head_weights[min(h, len(head_weights) - 1)] * loss_h
        with torch.no_grad():
            top = logits.topk(topk, -1).indices
            hit1 = top[:, 0] == lab
            hitk = (top == lab.unsqueeze(1)).any(-1)
            # chain acceptance: head h right AND all earlier heads right at this position
            ok = torch.zeros(B, T, dtype=torch.bool, device=dev)
            ok[b_i, t_i] = hit1
            chain = ok if prev_ok is None else ok & prev_ok
            cond_den = valid if prev_ok is None else valid & prev_ok
            metrics.append(dict(n=int(valid.sum()), ce=float(ce), soft=float(soft_ce), l1=float(l1),
                                top1=int(hit1.sum()), topk=int(hitk.sum()),
                                chain=int((chain & valid).sum()), cond_n=int(cond_den.sum()),
                                cond_hit=int((chain & cond_den).sum())))
            prev_ok = chain
    return total, metrics


def _collate(batch: list[dict], feats: dict, max_prompt: int, max_len: int, dtype, dev):
    rows = []
    for r in batch:
        f = feats[_rec_key(r["ids"])]
        s = max(0, r["start"] - max_prompt)
        ids, ft, start = r["ids"][s:], f[s:], r["start"] - s
        ids, ft = ids[:max_len], ft[:max_len]
        rows.append((ids, ft, start))
    T = max(len(x[0]) for x in rows)
    d = rows[0][1].shape[-1]
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    ft = torch.zeros(len(rows), T, d, dtype=dtype)
    for i, (a, b, _) in enumerate(rows):
        ids[i, : len(a)] = torch.tensor(a)
        ft[i, : len(a)] = b.to(dtype)
    lens = torch.tensor([len(x[0]) for x in rows])
    starts = torch.tensor([x[2] for x in rows])
    return ids.to(dev), ft.to(dev), lens.to(dev), starts.to(dev)


def _sum_metrics(acc: list, ms: list) -> list:
    if not acc:
        acc = [dict() for _ in ms]
    for a, m in zip(acc, ms):
        if m:
            for k, v in m.items():
                a[k] = a.get(k, 0) + v * (m["n"] if k in ("ce", "soft", "l1") else 1)
    return acc


def _fmt_metrics(acc: list) -> dict:
    out = {}
    for h, a in enumerate(acc, 1):
        if not a.get("n"):
            continue
        out[f"head{h}"] = dict(top1=round(a["top1"] / a["n"], 4), top3=round(a["topk"] / a["n"], 4),
                               chain=round(a["chain"] / a["n"], 4),
                               cond=round(a["cond_hit"] / max(1, a["cond_n"]), 4),
                               soft_ce=round(a["soft"] / a["n"], 4), l1=round(a["l1"] / a["n"], 4), n=a["n"])
    return out


@torch.no_grad()
def evaluate(heads, records, feats, args, dev) -> dict:
    heads.eval()
    acc: list = []
    for i in range(0, len(records), args.batch_size):
        batch = records[i : i + args.batch_size]
        ids, ft, lens, starts = _collate(batch, feats, args.max_prompt, args.max_len, torch.float32, dev)
        _, ms = unrolled_losses(heads, ids, ft, lens, starts, tuple(args.loss_weights))
        acc = _sum_metrics(acc, ms)
    heads.train()
    return _fmt_metrics(acc)


def train(args) -> int:
    from .models import cache_root, load_target

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_f = open(out / "train_log.txt", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_f.write(line + "\n")
        log_f.flush()

    command = " ".join(["python -m specdemo"] + sys.argv[1:]) if sys.argv[0].endswith("__main__.py") else " ".join(sys.argv)
    log(f"command: {command}")
    t_begin = time.time()
    deadline = t_begin + args.minutes * 60 if args.minutes else None
    target = load_target(args.model, device=args.device, dtype="float32")  # features as the CPU demo computes them
    dev = target.device
    records = read_records(args.data)
    if not records:
        log("no training records found")
        return 1
    held = [r for r in records if is_heldout_record(r["key"])]  # the one split every trainer uses
    held_ids = {id(r) for r in held}
    train_recs = [r for r in records if id(r) not in held_ids] if held else records
    held = [r for r in held if len(r["ids"]) <= args.max_len][: args.heldout_max]
    n_tok = sum(len(r["ids"]) - r["start"] for r in records)
    log(f"data: {len(records)} records ({len(train_recs)} train, {len(held)} held out), {n_tok} answer tokens, "
        f"{sum(len(r['ids']) for r in records)} tokens in all")
    fkey = f"{target.identity}-{target_config_hash(target)}-{str(target.dtype).split('.')[-1]}"
    cache_file = Path(args.feature_cache or cache_root() / "s4c-features") / f"{fkey}.pt"
    feats = extract_features(target, records, cache_file, args.max_prompt, log)

    ckpt = out / "checkpoint.pt"
    resume = ckpt.exists() and args.resume
    init = load_heads(target, args.init) if args.init and not resume else None  # warm start from an artifact
    if resume:
        state = torch.load(ckpt, weights_only=False)
        draft_vocab = state["model"]["draft_vocab"]
    elif init is not None:
        draft_vocab = init.draft_vocab.cpu()
        args.n_heads, args.intermediate_size = init.n_heads, init.intermediate_size
    else:
        special = sorted(target.eos_ids) + list(getattr(target.tokenizer, "all_special_ids", []) or [])
        draft_vocab = build_draft_vocab(records, args.draft_vocab, target.lm_head.weight.shape[0], special)
    heads = S4CHeads(target, args.n_heads, args.intermediate_size, draft_vocab).to(dev)
    if init is not None:
        heads.load_state_dict({k: v.float() for k, v in init.state_dict().items()}, strict=False)
        log(f"initialised from the heads in {args.init}")
    heads.train()
    params = [p for n, p in heads.named_parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(len(train_recs) / args.batch_size)
    total_steps = args.steps or args.epochs * steps_per_epoch
    step, rng = 0, random.Random(args.seed)
    if resume:
        heads.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["opt"])
        step = state["step"]
        rng.setstate(state["rng"])
        total_steps = max(total_steps, state.get("total_steps", 0)) if not args.steps else args.steps
        log(f"resumed from {ckpt} at step {step}")
    log(f"heads: {sum(p.numel() for p in params) / 1e6:.2f} M params, draft vocab {len(draft_vocab)}, "
        f"{total_steps} steps of {args.batch_size} sequences, lr {args.lr}")

    def lr_at(s: int) -> float:
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = min(1.0, (s - args.warmup) / max(1, total_steps - args.warmup))
        if deadline:  # a time budget: decay on whichever runs out first
            p = max(p, min(1.0, (time.time() - t_begin) / (deadline - t_begin)))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    extra = lambda: {"training": {"command": command, "step": step, "records": len(records),  # noqa: E731
                                  "answer_tokens": n_tok, "loss_weights": args.loss_weights, "seed": args.seed}}

    def checkpoint(final: bool = False) -> None:
        torch.save({"model": heads.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng.getstate(),
                    "total_steps": total_steps}, str(ckpt) + ".tmp")
        os.replace(str(ckpt) + ".tmp", ckpt)
        save_heads(heads, out, extra())
        log(f"{'final' if final else 'checkpoint'}: step {step}, heads saved to {out}")

    order: list[dict] = []
    t_start, tok_seen, acc = time.time(), 0, []
    try:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=step, desc="s4c", mininterval=5, file=sys.stderr)
    except ImportError:
        bar = None
    while step < total_steps:
        if not order:
            order = list(train_recs)
            rng.shuffle(order)
            # bucket by length within chunks so padded batches waste little
            order = [r for i in range(0, len(order), 64) for r in sorted(order[i : i + 64], key=lambda r: len(r["ids"]))]
            chunks = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
            rng.shuffle(chunks)
            order = [r for c in chunks for r in c]
        batch, order = order[: args.batch_size], order[args.batch_size :]
        ids, ft, lens, starts = _collate(batch, feats, args.max_prompt, args.max_len, torch.float32, dev)
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(step)
        loss, ms = unrolled_losses(heads, ids, ft, lens, starts, tuple(args.loss_weights), noise=args.noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tok_seen += int((lens - starts).clamp_min(0).sum())
        acc = _sum_metrics(acc, ms)
        if bar:
            bar.update(1)
        if step % args.log_every == 0:
            m = _fmt_metrics(acc)
            acc = []
            log(f"step {step}/{total_steps} loss {float(loss):.3f} lr {lr_at(step):.2e} "
                f"{tok_seen / (time.time() - t_start):.0f} tok/s | "
                + " ".join(f"h{h + 1} top1 {m[k]['top1']:.3f} cond {m[k]['cond']:.3f}" for h, k in enumerate(m)))
        if held and (step % args.eval_every == 0):
            log(f"held-out @ {step}: {json.dumps(evaluate(heads, held, feats, args, dev))}")
        if step % args.ckpt_every == 0:
            checkpoint()
        if deadline and time.time() > deadline:
            log(f"time budget of {args.minutes} min reached")
            break
    if bar:
        bar.close()
    checkpoint(final=True)
    if held:
        ev = evaluate(heads, held, feats, args, dev)
        log(f"held-out final: {json.dumps(ev)}")
        cfg = json.loads((out / "config.json").read_text())
        cfg["heldout"] = ev
        for name in ("sharegpt", "project"):
            part = [r for r in held if split_name(r["key"]) == name]
            if part:
                cfg[f"heldout_{name}"] = dict(evaluate(heads, part, feats, args, dev), records=len(part))
                log(f"held-out final ({name}, {len(part)} records): {json.dumps(cfg[f'heldout_{name}'])}")
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    log(f"done: {step} steps in {(time.time() - t_start) / 60:.1f} min")
    return 0


def register_train(subparsers) -> None:
    p = subparsers.add_parser("s4c", help="train S4C draft heads for a target model (CPU or GPU)")
    p.add_argument("--model", default="embedded")
    p.add_argument("--data", nargs="+", default=["assets/corpus/selfdistill.jsonl.gz"],
                   help="self-distilled corpora (.jsonl.gz from `python -m specdemo distill`) or jsonl with 'ids'")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--n-heads", type=int, default=3)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: --epochs over the data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minutes", type=float, default=0, help="stop (and save) this long after the start, features included; the lr decays to it")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--noise", type=float, default=0.0, help="Gaussian noise on head 1's input features (x std)")
    p.add_argument("--loss-weights", type=float, nargs=3, default=[0.1, 1.0, 1.0], metavar=("CE", "SOFT", "L1"))
    p.add_argument("--max-prompt", type=int, default=160, help="prompt tokens kept before each answer")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--heldout-max", type=int, default=256, help="held-out records evaluated at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--init", default=None, help="start from these trained heads (folder or hub id) instead of scratch")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/checkpoint.pt when it exists (default)")
    p.add_argument("--feature-cache", default=None, help="folder for cached target features")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(func=train)
