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

Training: `specdemo/offline/train_s4c.py` (`python -m specdemo train s4c`).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from torch import nn

from specdemo import ASSETS as PACKAGE_ASSETS
from specdemo import artifacts
from specdemo.artifacts import architecture_hash, resolve_dir
from specdemo.cpu_linear import usable_weights, use_packed_linears
from specdemo.target import EMBEDDED

FORMAT = "specdemo-s4c"
VERSION = 1
ASSETS = PACKAGE_ASSETS / "s4c"
EMBEDDED_HEADS = ASSETS / "smollm2-135m-instruct"
# prompt tokens kept before each answer in training (`train s4c --max-prompt`'s default); the drafter's `window`
# for heads whose config does not record theirs
TRAINED_PROMPT = 160


class S4CArtifactError(RuntimeError):
    """Heads missing, unreadable, or trained for another target model; the message says what to do."""


# ---------------------------------------------------------------------------------------------------------- identity
def mismatch(cfg: dict, target, where: Path | str) -> str | None:
    """Why the heads described by `cfg` do not fit `target` (None when they do)."""
    return artifacts.mismatch(cfg, target, fmt=FORMAT, identity_key="tokenizer_identity",
                              hash_key="target_config_hash", what="S4C draft heads", where=where,
                              fix=f"Train heads for this model: {train_command(target.name, str(where))}")


def train_command(target_name: str, out: str = "DIR") -> str:
    return f"python -m specdemo train s4c --model {target_name} --data assets/corpus/selfdistill.jsonl.gz --out {out}"


# ---------------------------------------------------------------------------------------------------------- model
class S4CHeads(nn.Module):
    """H heads: Linear(2d -> d) + one target-class decoder layer + RMSNorm each.  Embedding and LM head are the
    target's (frozen, not stored); `draft_vocab` is a buffer of token ids the heads score against."""

    def __init__(self, target, n_heads: int = 3, intermediate_size: int = 768, draft_vocab: torch.Tensor | None = None,
                 feature_layers: tuple[int, ...] = ()):
        """feature_layers: decoder layers whose states head 1 also reads (EAGLE-3's fused low/middle/high features):
        its input feature is then a learned projection of those states and the last hidden state side by side,
        starting as "the last hidden state alone"."""
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
        self.draft_weights = "fp32"  # what the drafting products multiply with (`cached_heads` packs them)
        layer_cls, norm_cls = type(dec.layers[0]), type(dec.norm)
        self.fc = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(n_heads))
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.fuse = nn.Linear((len(self.feature_layers) + 1) * d, d) if self.feature_layers else None
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
            if self.fuse is not None:  # starts as "the last hidden state alone" (the last d columns)
                self.fuse.weight.zero_()
                self.fuse.weight[:, -d:] = torch.eye(d)
                self.fuse.bias.zero_()
        if draft_vocab is None:
            draft_vocab = torch.arange(target.model.config.vocab_size)
        self.register_buffer("draft_vocab", draft_vocab.long().clone(), persistent=True)
        # frozen references to the target (not parameters of this module, never saved)
        self._target = [target]
        self.to(target.device)  # beside the target; its dtype is the caller's (training keeps fp32)

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
        """Head h (0-based) over (B, T) positions: [e(x); u] -> features (B, T, d).  Head 1's u is the target's
        feature, fused from the declared layers when there are some."""
        if h == 0 and self.fuse is not None:
            feat = self.fuse(feat)
        x = self.fc[h](torch.cat([emb, feat], dim=-1))
        pe = self.rotary(x, position_ids)
        kw = dict(attention_mask=mask, position_ids=position_ids, position_embeddings=pe)
        if cache is not None:
            kw.update(past_key_values=cache, use_cache=True)
        y = self.layers[h](x, **kw)
        if isinstance(y, tuple):
            y = y[0]
        return self.norms[h](y)

    def copy_deepest(self, trained: int) -> None:
        """Heads past the first `trained` become copies of the deepest trained one (training more heads than a warm
        start had): it already maps a head's output and the next token to the next feature, as a deeper head does."""
        for h in range(trained, self.n_heads):
            for part in (self.fc, self.layers, self.norms):
                part[h].load_state_dict(part[trained - 1].state_dict())

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
        "target": t.name, "tokenizer_identity": t.identity, "target_config_hash": architecture_hash(t.model.config),
        "target_model_type": t.model.config.model_type, "feature_layers": list(heads.feature_layers),
    }
    cfg.update(extra or {})
    tmp = out / "model.safetensors.tmp"
    save_file(heads.artifact_state(), str(tmp), metadata={"format": FORMAT})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_heads(target, source: str | Path) -> S4CHeads:
    from safetensors.torch import load_file

    path = resolve_dir(source, ("config.json", "model.safetensors"), "S4C heads", S4CArtifactError,
                       f"Train heads with: {train_command(target.name)}")
    cfg = json.loads((path / "config.json").read_text())
    if (why := mismatch(cfg, target, path)) is not None:
        raise S4CArtifactError(why)
    sd = load_file(str(path / "model.safetensors"))
    heads = S4CHeads(target, cfg["n_heads"], cfg["intermediate_size"], sd.pop("draft_vocab").long(),
                     tuple(cfg.get("feature_layers", ())))
    missing, unexpected = heads.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.") and k != "draft_vocab"]
    if missing or unexpected:
        raise S4CArtifactError(f"S4C heads in {path} do not match the model layout (missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}).")
    heads.to(device=target.device, dtype=target.dtype)
    heads.eval().requires_grad_(False)
    heads.config = cfg
    return heads


# ------------------------------------------------------------------------------------------- the model's own heads
def default_heads(target) -> Path | None:
    """The shipped heads of `target`'s model: only the embedded model has some."""
    return EMBEDDED_HEADS if target.name == EMBEDDED else None


def cached_heads(target, source: str, weights: str = "fp16") -> S4CHeads:
    """Heads loaded once per model and kept on it (they hold the model: a global cache would keep it alive), their
    linear layers on the CPU's packed path like the target's (a head call has 1-10 rows) at `weights`
    (`cpu_linear.WEIGHTS`, falling back where this CPU lacks the kernel): the heads only draft, and a head call streams
    its weights once per step (`cpu_linear.draft_weights`)."""
    weights = usable_weights(weights) if target.packed_linears else "fp32"  # elsewhere: the target's dtype either way
    key = ("s4c-heads", source, weights)
    if key not in target.artifacts:
        heads = load_heads(target, source)
        if target.packed_linears:
            use_packed_linears(heads, weights=weights)
        heads.draft_weights = weights
        target.artifacts[key] = heads
    return target.artifacts[key]


def missing_heads(target) -> str:
    """What to say when a model has no heads: the command that trains them and the option that picks them."""
    return (f"S4C has no draft heads for '{target.name}'. Train them with: {train_command(target.name, 'HEADS_DIR')} "
            f"and pick them with the option heads=HEADS_DIR.")


def unavailable_reason(target) -> str | None:
    """Why S4C cannot run on `target` with its default heads (reads their config only), or None."""
    src = default_heads(target)
    if src is None or not (src / "model.safetensors").exists():
        return missing_heads(target)
    try:
        cfg = json.loads((src / "config.json").read_text())
    except (OSError, ValueError):
        return f"The S4C heads in {src} are unreadable; rebuild them: {train_command(target.name, str(src))}"
    return mismatch(cfg, target, src)
