"""What trained drafter artifacts (S4C heads, SDSAT adapters) share: the identity of the model they fit, and finding
them in a local folder or on the Hugging Face hub.

An artifact records its target's tokenizer identity and `architecture_hash`; loading compares both, so heads trained
for one model are refused on another with a message instead of drafting garbage.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specdemo import hub

# The config fields a draft artifact's shapes and positions depend on.
ARCHITECTURE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_theta",
                     "tie_word_embeddings")


def architecture_hash(config) -> str:
    """A short hash of a transformers config's architecture fields."""
    fields = {k: getattr(config, k, None) for k in ARCHITECTURE_KEYS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_dir(source: str | Path, needs: tuple[str, ...], what: str, error: type[Exception],
                hint: str) -> Path:
    """A local folder holding the files `needs`, or a hub repo id (owner/name) fetched with
    huggingface_hub.snapshot_download.  Anything else, or a download that fails (offline, missing repo, auth),
    raises `error` with a message naming `what` and `hint` (how to make one)."""
    p = Path(source).expanduser()
    if p.is_dir():
        missing = [f for f in needs if not (p / f).exists()]
        if missing:
            raise error(f"{what} folder {p} lacks {', '.join(missing)}. {hint}")
        return p
    if p.exists() or str(source).startswith((".", "/", "~")) or str(source).count("/") != 1:
        raise error(f"{what} '{source}' not found: not a local folder and not a hub repo id (owner/name). {hint}")
    local = hub.local_only()  # no hub to ask: the local hub cache only, at once
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=str(source), allow_patterns=["*.json", "*.safetensors", "*.md"],
                                      local_files_only=local))
    except Exception as exc:
        why = ("the hub cannot be reached (offline) and it is not in the local hub cache" if local
               else "it could not be downloaded from the hub")
        raise error(f"{what} '{source}' is not a local folder and {why} ({type(exc).__name__}: {str(exc)[:200]}). "
                    f"Pass a local folder instead.") from exc


def mismatch(cfg: dict, target, *, fmt: str, identity_key: str, hash_key: str, what: str, where: Path | str,
             fix: str) -> str | None:
    """Why the artifact described by `cfg` (its config file) does not fit `target`; None when it does.  `fix` says
    how to make one that does."""
    if cfg.get("format") != fmt:
        return f"{where} does not hold {what} (format {cfg.get('format')!r}, expected {fmt!r})."
    got = (cfg.get(identity_key), cfg.get(hash_key))
    want = (target.identity, architecture_hash(target.model.config))
    if got == want:
        return None
    return (f"The {what} in {where} was made for another model (tokenizer {got[0]}, config {got[1]}), not for "
            f"'{target.name}' (tokenizer {want[0]}, config {want[1]}). {fix}")
