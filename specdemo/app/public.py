"""The public mode: what a visitor of a shared deployment may not make the server do.

On by default on a Hugging Face Space (`SPACE_ID` is set) or with `SPECDEMO_PUBLIC=1`; `SPECDEMO_PUBLIC=0` turns it
off.  In the public mode a model is the embedded one or a hub id (never a server path), optionally from an allow-list
(`SPECDEMO_MODELS`, comma-separated), and no larger than `SPECDEMO_MAX_PARAMS` parameters (default: what the
machine's memory holds comfortably), checked from the model's config before any weights are downloaded; drafter
options that name files or folders on the server are refused.  The local mode keeps full freedom.
"""
from __future__ import annotations

import os

import torch

from specdemo import hub
from specdemo.drafters import options as declared_options
from specdemo.target import EMBEDDED, pick_device_dtype


class PublicModeRefusal(Exception):
    """A request the public mode does not allow; the message says what is allowed instead."""


def public_mode() -> bool:
    flag = os.environ.get("SPECDEMO_PUBLIC", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    return flag in ("1", "true", "yes", "on") or bool(os.environ.get("SPACE_ID"))


def allowed_models() -> tuple[str, ...] | None:
    names = [m.strip() for m in os.environ.get("SPECDEMO_MODELS", "").split(",") if m.strip()]
    return tuple(names) or None


def memory_bytes(device: torch.device) -> int:
    """Total memory of the device the model would run on."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def max_params() -> int:
    """SPECDEMO_MAX_PARAMS, or the parameters whose weights fill a quarter of the device's memory in the dtype models
    load in (the rest: activations, the KV caches, a second cached model, the app)."""
    if (cap := os.environ.get("SPECDEMO_MAX_PARAMS", "").strip()):
        return int(float(cap))
    device, dtype = pick_device_dtype(None, None)
    return memory_bytes(device) // (4 * torch.finfo(dtype).bits // 8)


def count_params(config) -> int:
    """Parameters of a causal LM built from `config`, on the meta device (no memory, no weights)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


def fetch_config(repo_id: str):
    """The model's config.json from the hub (a few kB; no weights)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(repo_id, trust_remote_code=False, local_files_only=hub.local_only())


def check_model(name: str, config_of=fetch_config) -> None:
    """Refuse, in the public mode, a model this deployment must not load; no-op in the local mode."""
    if not public_mode() or name == EMBEDDED:
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if name.count("/") != 1:
            raise HFValidationError("not owner/name")
        validate_repo_id(name)
    except HFValidationError:
        raise PublicModeRefusal(f"This public demo loads '{EMBEDDED}' or a Hugging Face hub id (owner/name), not "
                                f"'{name[:80]}'. Run it locally (`make run`) to load a folder.") from None
    allowed = allowed_models()
    if allowed is not None and name not in allowed:
        raise PublicModeRefusal(f"This demo serves these models only: {', '.join((EMBEDDED,) + allowed)}.")
    try:
        n = count_params(config_of(name))
    except Exception as exc:  # noqa: BLE001 -- no config, not a causal LM, hub unreachable: all mean "not here"
        raise PublicModeRefusal(f"Cannot read the config of '{name}' to check its size ({type(exc).__name__}: "
                                f"{str(exc)[:200]}).") from exc
    cap = max_params()
    if n > cap:
        raise PublicModeRefusal(f"'{name}' has {n / 1e9:.2f}B parameters; this deployment loads models up to "
                                f"{cap / 1e9:.2f}B (SPECDEMO_MAX_PARAMS).")


def check_options(method: str, values: dict) -> None:
    """Refuse, in the public mode, drafter options that name a file or folder on the server."""
    if not public_mode() or method == "ar":
        return
    for option in declared_options(method):
        value = values.get(option.name)
        if option.kind == "path" and value is not None and value not in option.special:
            allowed = " or ".join(repr(s) for s in option.special) or "its default (leave it out)"
            raise PublicModeRefusal(f"This public demo does not open server paths: option {option.name} takes "
                                    f"{allowed} here.")
