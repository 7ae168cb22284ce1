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
drafter.py beside this file).

Training: `specdemo/offline/train_sdsat.py` (`python -m specdemo train sdsat`).
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path

import torch

from specdemo import ASSETS as PACKAGE_ASSETS
from specdemo import artifacts
from specdemo.artifacts import architecture_hash, resolve_dir
from specdemo.precision import Int4Linear

FORMAT = "specdemo-sdsat"
VERSION = 1
ADAPTER_FILE = "adapter_model.safetensors"
EMBED_FILE = "sdsat_embedding.safetensors"
CONFIG_FILE = "sdsat_config.json"
PEFT_CONFIG_FILE = "adapter_config.json"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ASSETS = PACKAGE_ASSETS / "sdsat"


class AdapterError(RuntimeError):
    """The SDSAT artifact is missing, malformed or made for another base model."""


def _linear_modules(model, targets) -> dict[str, torch.nn.Module]:
    """name (as in model.named_modules, e.g. 'model.layers.0.self_attn.q_proj') -> linear layer, for the decoder
    layers (an nn.Linear, or precision.Int4Linear at int4: the adapter only reads their inputs and outputs)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, Int4Linear)) and name.split(".")[-1] in targets and ".layers." in name:
            out[name] = mod
    if not out:
        raise AdapterError(f"no linear layers named {list(targets)} in {type(model).__name__}")
    return out


def _register_output_hook(mod: torch.nn.Module, hook) -> list:
    """The handles of `hook` on `mod`'s output, wherever it is computed: on `mod` (the transformers forward: training,
    prefill), and where a decoding step computes `mod` inside a fused product (`step_decoder.py` sets `fused_into` =
    (that product, its first output column)), on that product too, showing `hook` `mod`'s columns: the hooks here add
    to their output in place, so they work on a view.  A forward runs one of the two, never both."""
    handles = [mod.register_forward_hook(hook)]
    fused = getattr(mod, "fused_into", None)
    if fused is not None:
        product, start = fused
        end = start + mod.out_features

        def on_columns(_, args, out):
            hook(mod, args, out[..., start:end])
            return out

        handles.append(product.register_forward_hook(on_columns))
    return handles


def _register_group_hooks(mods: list[torch.nn.Module], hooks: list) -> list:
    """The handles of each module's hook in a tree verification, which a decoding step computes (its only forward
    inside `SDSATAdapter.active` at inference).  Where that step computes the whole group in one fused product (the
    parts' `fused_into` name the same product), one hook on the product runs every part's hook on its columns: a
    verification registers and calls one hook per group instead of one per part on the part and one on the product,
    ~120 hooks on the embedded model, whose registering and removing alone took 0.4 ms of every SDSAT step (0.2 ms
    grouped; docs/sdsat.md).  Elsewhere, each part as `_register_output_hook` registers it."""
    fused = [getattr(m, "fused_into", None) for m in mods]
    if any(f is None for f in fused) or len({id(f[0]) for f in fused}) != 1:
        return [h for m, hook in zip(mods, hooks) for h in _register_output_hook(m, hook)]
    columns = [(m, hook, start, start + m.out_features) for m, hook, (_, start) in zip(mods, hooks, fused)]

    def on_columns(_, args, out):
        for m, hook, start, end in columns:
            hook(m, args, out[..., start:end])
        return out

    return [fused[0][0].register_forward_hook(on_columns)]


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
        # the probe rows `active_at` reads: one set per adapter, so every drafter over it writes the masks its
        # captured CUDA graphs read
        self.probe_rows = ProbeRows()

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
                    handles += _register_group_hooks(mods, self._group_hooks(a_cat, b_list, run))
                yield
                return
            for name, mod in self._mods.items():
                key = name.replace(".", "__")
                handles += _register_output_hook(mod, make_hook(self.lora_A[key], self.lora_B[key]))
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def active_at(self, rows: list[int]):
        """`active` for inference in a form a CUDA graph can replay: `rows` go into the static masks of
        `self.probe_rows`, and the hooks run on every row of the forward and read the probe rows from those masks, so
        a graph captured through them applies the adapter at each later step's rows, not the capture's.  A row that
        is not a probe gets exactly its plain output (its own embedding; + 0 from a zeroed LoRA input)."""
        probes = self.probe_rows
        probes.set(rows)
        handles = []

        def emb_hook(mod, args, out):
            on, _ = probes.masks(out.shape[1], out.device)
            return torch.where(on, self.embedding.to(out.dtype), out)

        try:
            handles.append(self._base[0].register_forward_hook(emb_hook))
            for mods, a_cat, b_list in self._inference_groups():
                for mod, hook in zip(mods, self._group_hooks(a_cat, b_list, slice(None), probes)):
                    handles += _register_output_hook(mod, hook)
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

    def _group_hooks(self, a_cat: torch.Tensor, b_list: list[torch.Tensor], run: slice,
                     probes: "ProbeRows | None" = None):
        """One forward hook per module of a group: the first computes x[run] @ A_cat for the shared input, the others
        reuse it; each adds its own slice @ B to its output rows in place.  With `probes` (`active_at`: run is every
        row) the product is zeroed outside the probe rows, so the others get + 0."""
        memo: list = [None, None]  # (input tensor, its product)
        r = self.rank

        def make(i: int, b: torch.Tensor):
            def hook(mod, args, out):
                x = args[0]
                if memo[0] is not x:
                    memo[0], memo[1] = x, x[0, run] @ a_cat
                    if probes is not None:
                        memo[1] = memo[1] * probes.masks(x.shape[1], x.device)[1].to(x.dtype)
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
               "base_config_hash": architecture_hash(model.config), "weights_dtype": str(dtype).replace("torch.", "")}
        cfg.update(extra or {})
        (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=1))
        return out


def train_command(target) -> str:
    return (f"python -m specdemo train sdsat --model {target.name} "
            f"--data assets/corpus/selfdistill.jsonl.gz --out {default_artifact_dir(target)}")


def mismatch(cfg: dict, target, where: Path | str) -> str | None:
    """Why the adapter described by `cfg` does not fit `target` (None when it does)."""
    return artifacts.mismatch(cfg, target, fmt=FORMAT, identity_key="base_identity", hash_key="base_config_hash",
                              what="SDSAT adapter", where=where, fix=f"Train one with `{train_command(target)}`.")


def load_adapter(spec: str | Path, target) -> tuple[SDSATAdapter, dict]:
    """Load an artifact for `target` (a specdemo Target); refuse one made for another base model."""
    from safetensors.torch import load_file

    path = resolve_dir(spec, (CONFIG_FILE, ADAPTER_FILE, EMBED_FILE), "SDSAT adapter", AdapterError,
                       f"Make one with `{train_command(target)}`.")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    if (why := mismatch(cfg, target, path)) is not None:
        raise AdapterError(why)
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


class ProbeRows:
    """Which rows of a verification forward are probes, as static per-size masks (a padded forward has a fixed
    number of rows per bucket): `set` rewrites every mask in place before a forward, so a CUDA graph that reads them
    sees the current step's rows."""

    def __init__(self) -> None:
        self._masks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rows -> (bool (1, rows, 1), (rows, 1))
        self._rows: list[int] = []

    def masks(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if rows not in self._masks:
            on = torch.zeros(1, rows, 1, dtype=torch.bool, device=device)
            weight = torch.zeros(rows, 1, device=device)
            self._masks[rows] = (on, weight)
            self._write(on, weight)
        return self._masks[rows]

    def set(self, rows: list[int]) -> None:
        self._rows = list(rows)
        for on, weight in self._masks.values():
            self._write(on, weight)

    def _write(self, on: torch.Tensor, weight: torch.Tensor) -> None:
        on.zero_()
        weight.zero_()
        rows = [r for r in self._rows if r < on.shape[1]]
        if rows:
            idx = torch.tensor(rows, dtype=torch.long).to(on.device, non_blocking=True)
            on[0, idx] = True
            weight[idx] = 1.0
