"""SDSAT adapter: semantic adaptive tokens that are active ONLY at adaptive-token (probe) positions.

Design (see docs/sdsat.md).  SDSAT (Liu et al.) fine-tunes the whole model so that k appended adaptive tokens predict
the next k tokens; the fine-tuned model then also verifies, so its output drifts from the original model.  Here the
original model must stay the verifier, so the trained part is confined to adaptive positions:

* a LoRA adapter (peft-format weights: lora_A / lora_B per linear layer) whose delta is added ONLY to the rows of
  adaptive positions, through forward hooks registered for the duration of one forward;
* a learned embedding for the adaptive token, written into the embedding output ONLY at adaptive positions (the real
  embedding matrix is tied to the LM head and is never touched).

Adaptive tokens come after the context they draft from, and only adaptive tokens attend to adaptive tokens, so every
standard position's hidden states, KV entries and logits are exactly the original model's.  One target forward can
therefore verify the current draft AND draft the next step (probe chains hung off candidate accept points, see
drafters/sdsat.py).

Training (`python -m specdemo train sdsat`): the base model is frozen and the adapter is off at standard positions, so
the paper's clean-sequence CE term is a constant with zero gradient: it is neither computed nor optimised.  The mixed
term becomes: for a clean (self-distilled) sequence, one no-grad base forward builds its KV cache; then chains of L
adaptive tokens hung after sampled origins p (each chain attends to x_0..x_p and to its own earlier adaptive tokens,
exactly as at inference) are run with the adapter on; adaptive token j of the chain at p is trained with CE against
x_{p+j+1}, the original model's own greedy token.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .sharegpt import is_heldout_record, split_name

FORMAT = "specdemo-sdsat"
VERSION = 1
ADAPTER_FILE = "adapter_model.safetensors"
EMBED_FILE = "sdsat_embedding.safetensors"
CONFIG_FILE = "sdsat_config.json"
PEFT_CONFIG_FILE = "adapter_config.json"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "sdsat"


class AdapterError(RuntimeError):
    """The SDSAT artifact is missing, malformed or made for another base model."""


def base_config_hash(model) -> str:
    """A short hash of the architecture fields an adapter depends on."""
    c = model.config
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "rope_theta", "tie_word_embeddings")
    d = {k: getattr(c, k, None) for k in keys}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _linear_modules(model, targets) -> dict[str, torch.nn.Linear]:
    """name (as in model.named_modules, e.g. 'model.layers.0.self_attn.q_proj') -> Linear, for the decoder layers."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in targets and ".layers." in name:
            out[name] = mod
    if not out:
        raise AdapterError(f"no linear layers named {list(targets)} in {type(model).__name__}")
    return out


class SDSATAdapter(torch.nn.Module):
    """LoRA weights + the adaptive token's embedding, applied to a base model through temporary forward hooks."""

    def __init__(self, model, rank: int = 16, alpha: float = 16.0, targets=DEFAULT_TARGETS, token_id: int = 0,
                 init_seed: int = 0):
        super().__init__()
        self.rank, self.alpha, self.targets, self.token_id = rank, float(alpha), tuple(targets), int(token_id)
        self.scale = self.alpha / self.rank
        # base-model modules kept in plain containers: not registered, so not part of parameters()/state_dict()
        self._mods = _linear_modules(model, self.targets)
        self._base = (model.get_input_embeddings(),)
        ref = self._base[0].weight
        g = torch.Generator().manual_seed(init_seed)
        self.lora_A = torch.nn.ParameterDict()
        self.lora_B = torch.nn.ParameterDict()
        for name, mod in self._mods.items():
            key = name.replace(".", "__")
            a = torch.empty(rank, mod.in_features)
            bound = 1 / math.sqrt(mod.in_features)  # as kaiming_uniform_(a=sqrt(5)) (peft's default init)
            a.uniform_(-bound, bound, generator=g)
            self.lora_A[key] = torch.nn.Parameter(a.to(ref.dtype))
            self.lora_B[key] = torch.nn.Parameter(torch.zeros(mod.out_features, rank, dtype=ref.dtype))
        self.embedding = torch.nn.Parameter(ref.detach()[self.token_id].clone())
        self.to(ref.device)

    # ------------------------------------------------------------------ hooks
    @contextmanager
    def active(self, rows: torch.Tensor | None = None):
        """Within this block, forwards of the base model use the adapter at `rows` of the (1, n, .) inputs.

        rows=None means every row (training feeds adaptive tokens only).  Hooks are removed on exit, so the base
        model is the plain original model outside the block.
        """
        handles = []
        rows_t = None if rows is None else rows.to(self.embedding.device)
        # probes come last in a tree, so at inference the rows are usually one contiguous run: views, no gathers
        run = None
        if rows_t is not None and len(rows_t) and int(rows_t[-1]) - int(rows_t[0]) + 1 == len(rows_t):
            run = slice(int(rows_t[0]), int(rows_t[-1]) + 1)

        def emb_hook(mod, args, out):
            if rows_t is None:
                return self.embedding.to(out.dtype).expand_as(out)
            out = out.clone() if out.requires_grad else out
            out[:, run if run is not None else rows_t] = self.embedding.to(out.dtype)
            return out

        def make_hook(a: torch.Tensor, b: torch.Tensor):  # training, and probe rows that are not one run
            def hook(mod, args, out):
                x = args[0]
                if rows_t is None:
                    return out + (x @ a.t()) @ b.t() * self.scale
                delta = (x[:, rows_t] @ a.t()) @ b.t() * self.scale
                if out.requires_grad:
                    return out.index_add(1, rows_t, delta)
                out[:, rows_t] += delta
                return out
            return hook

        fast = run is not None and not torch.is_grad_enabled() and not self.embedding.requires_grad
        try:
            handles.append(self._base[0].register_forward_hook(emb_hook))
            if fast:  # inference on one contiguous run of probe rows: grouped LoRA-A products
                for mods, a_cat, b_list in self._inference_groups():
                    for mod, hook in zip(mods, self._group_hooks(a_cat, b_list, run)):
                        handles.append(mod.register_forward_hook(hook))
                yield
                return
            for name, mod in self._mods.items():
                key = name.replace(".", "__")
                handles.append(mod.register_forward_hook(make_hook(self.lora_A[key], self.lora_B[key])))
            yield
        finally:
            for h in handles:
                h.remove()

    def _inference_groups(self):
        """Modules that read the same input (q/k/v of one layer, gate/up of one layer, ...) with their LoRA-A
        matrices stacked, so one product serves the group; B pre-transposed and pre-scaled.  Built once and reused
        until a weight changes (tensor versions), so a drafting step does no weight preparation."""
        version = tuple(p._version for p in self.parameters())
        if getattr(self, "_groups_version", None) != version:
            groups: dict[tuple, list[str]] = {}
            for name in self._mods:
                parent, leaf = name.rsplit(".", 1)
                kind = "qkv" if leaf in ("q_proj", "k_proj", "v_proj") else "gu" if leaf in ("gate_proj", "up_proj") \
                    else leaf
                groups.setdefault((parent, kind), []).append(name)
            built = []
            with torch.no_grad():
                for names in groups.values():
                    keys = [n.replace(".", "__") for n in names]
                    a_cat = torch.cat([self.lora_A[k] for k in keys]).t().contiguous()  # (in, r * group)
                    b_list = [(self.lora_B[k] * self.scale).t().contiguous() for k in keys]  # (r, out) each
                    built.append(([self._mods[n] for n in names], a_cat, b_list))
            self._groups, self._groups_version = built, version
        return self._groups

    def _group_hooks(self, a_cat: torch.Tensor, b_list: list[torch.Tensor], run: slice):
        """One forward hook per module of a group: the first computes x[run] @ A_cat for the shared input, the others
        reuse it; each adds its own slice @ B to its output rows in place."""
        memo: list = [None, None]  # (input tensor, its product)
        r = self.rank

        def make(i: int, b: torch.Tensor):
            def hook(mod, args, out):
                x = args[0]
                if memo[0] is not x:
                    memo[0], memo[1] = x, x[0, run] @ a_cat
                out[0, run].addmm_(memo[1][:, i * r : (i + 1) * r], b)
                return out
            return hook

        return [make(i, b) for i, b in enumerate(b_list)]

    # ------------------------------------------------------------------ artifact
    def peft_state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for name in self._mods:
            key = name.replace(".", "__")
            out[f"base_model.model.{name}.lora_A.weight"] = self.lora_A[key].detach().contiguous()
            out[f"base_model.model.{name}.lora_B.weight"] = self.lora_B[key].detach().contiguous()
        return out

    def load_peft_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for name in self._mods:
            key = name.replace(".", "__")
            for part, store in (("lora_A", self.lora_A), ("lora_B", self.lora_B)):
                k = f"base_model.model.{name}.{part}.weight"
                if k not in sd:
                    raise AdapterError(f"adapter weights lack {k}")
                if sd[k].shape != store[key].shape:
                    raise AdapterError(f"adapter weight {k} has shape {tuple(sd[k].shape)}, "
                                       f"the model needs {tuple(store[key].shape)}")
                with torch.no_grad():
                    store[key].copy_(sd[k].to(store[key].dtype))

    def save(self, out_dir: str | Path, target_identity: str, model, extra: dict | None = None,
             dtype: torch.dtype = torch.float16) -> Path:
        """Write the artifact: peft-format LoRA weights + adapter_config.json, the embedding, sdsat_config.json."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.to(dtype).cpu() for k, v in self.peft_state_dict().items()}, str(out / ADAPTER_FILE),
                  metadata={"format": "pt"})
        save_file({"embedding": self.embedding.detach().float().cpu()}, str(out / EMBED_FILE))
        peft_cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                    "lora_dropout": 0.0, "bias": "none", "target_modules": list(self.targets),
                    "base_model_name_or_path": getattr(model.config, "_name_or_path", ""), "fan_in_fan_out": False,
                    "inference_mode": True}
        (out / PEFT_CONFIG_FILE).write_text(json.dumps(peft_cfg, indent=1))
        cfg = {"format": FORMAT, "version": VERSION, "rank": self.rank, "alpha": self.alpha,
               "targets": list(self.targets), "token_id": self.token_id, "base_identity": target_identity,
               "base_config_hash": base_config_hash(model), "weights_dtype": str(dtype).replace("torch.", "")}
        cfg.update(extra or {})
        (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=1))
        return out


def resolve_artifact(spec: str | Path) -> Path:
    """A local folder, or a hub repo id fetched with huggingface_hub.snapshot_download (clear error offline)."""
    p = Path(spec)
    if p.is_dir():
        if not (p / CONFIG_FILE).exists():
            raise AdapterError(f"{p} is not an SDSAT adapter folder (no {CONFIG_FILE}).")
        return p
    if p.exists() or str(spec).startswith((".", "/")) or str(spec).count("/") != 1:
        raise AdapterError(f"SDSAT adapter '{spec}' not found: give a folder made by `python -m specdemo train sdsat`"
                           " or a hub repo id (owner/name).")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=str(spec), allow_patterns=["*.json", "*.safetensors", "*.md"]))
    except Exception as exc:  # offline, missing repo, auth
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        why = "the hub cannot be reached (offline)" if offline else "it could not be downloaded from the hub"
        raise AdapterError(f"SDSAT adapter '{spec}' is not a local folder and {why} "
                           f"({type(exc).__name__}: {str(exc)[:200]}).") from exc


def load_adapter(spec: str | Path, target) -> tuple[SDSATAdapter, dict]:
    """Load an artifact for `target` (a specdemo Target); refuse one made for another base model."""
    from safetensors.torch import load_file

    path = resolve_artifact(spec)
    cfg = json.loads((path / CONFIG_FILE).read_text())
    if cfg.get("format") != FORMAT:
        raise AdapterError(f"{path / CONFIG_FILE} is not an {FORMAT} config")
    if cfg.get("base_identity") != target.identity or cfg.get("base_config_hash") != base_config_hash(target.model):
        raise AdapterError(
            f"The SDSAT adapter in {path} was trained for another base model (tokenizer {cfg.get('base_identity')}, "
            f"config {cfg.get('base_config_hash')}); this model is {target.identity}, config "
            f"{base_config_hash(target.model)}. Train one with `python -m specdemo train sdsat --model {target.name} "
            f"--out DIR`.")
    ad = SDSATAdapter(target.model, cfg["rank"], cfg["alpha"], cfg["targets"], cfg["token_id"])
    ad.load_peft_state_dict(load_file(str(path / ADAPTER_FILE)))
    with torch.no_grad():
        ad.embedding.copy_(load_file(str(path / EMBED_FILE))["embedding"].to(ad.embedding.dtype))
    ad.requires_grad_(False)
    ad.eval()
    return ad, cfg


def default_artifact_dir(target) -> Path:
    name = "embedded" if target.name.startswith("embedded") else target.name.replace("/", "--")
    return ASSETS / name


def default_token_id(tokenizer) -> int:
    """An unused special (SmolLM2: ids 3-16 are code-only specials); the id only labels probe nodes in trees."""
    for tok in ("<empty_output>", "<reponame>", "<repo_name>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None and tid >= 0:
            return tid
    return 0


# ====================================================================================================== training data
def read_selfdistill(path: str | Path) -> list[dict]:
    """Records {"id", "prompt_ids", "answer_ids"} of a self-distilled corpus (`python -m specdemo distill`)."""
    from .distill import read_corpus

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training data {path} not found (make it with `python -m specdemo distill`)")
    return [r for r in read_corpus(path)[1] if "answer_ids" in r and "prompt_ids" in r]


def split_records(paths: list[str | Path], heldout_max: int, max_seq: int) -> tuple[list, list]:
    """(training, held-out) records of self-distilled corpora: usable lengths only, held out by the one shared split
    (sharegpt.is_heldout_record); the held-out list alternates the ShareGPT and project records so both are seen."""
    recs = [r for path in paths for r in read_selfdistill(path)
            if len(r["answer_ids"]) >= 3 and len(r["prompt_ids"]) + len(r["answer_ids"]) <= max_seq]
    held = [r for r in recs if is_heldout_record(r["id"])]
    by_split = [[r for r in held if split_name(r["id"]) == name] for name in ("sharegpt", "project")]
    mixed = [r for pair in itertools.zip_longest(*by_split) for r in pair if r is not None]
    return [r for r in recs if not is_heldout_record(r["id"])], mixed[:heldout_max]


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
    from .models import load_target

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
