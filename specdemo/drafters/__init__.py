"""Drafters: each proposes a draft tree per step; the engine verifies it.  This file is the one registry.

A method module `specdemo/drafters/<method>.py` provides:
    make(target, **options) -> Drafter        # raises DrafterUnavailable with the command that creates the artifact
    unavailable_reason(target) -> str | None  # None when usable on this model (cheap: no heavy loading)
"""
from __future__ import annotations

import importlib

from ..engine import Drafter
from ..models import Target


class DrafterUnavailable(RuntimeError):
    """A drafter's artifact (datastore, heads, adapter) is missing or wrong for this model; says how to make it."""


METHODS = ("ar", "pld", "rest", "s4c", "sdsat")
LABELS = {"ar": "Autoregressive", "pld": "Prompt lookup", "rest": "REST", "s4c": "S4C", "sdsat": "SDSAT"}


def _module(method: str):
    if method not in METHODS:
        raise ValueError(f"Unknown method '{method}'. Known: {', '.join(METHODS)}.")
    return importlib.import_module(f".{method}", __name__)


def make_drafter(method: str, target: Target, **options) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR)."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return _module(method).make(target, **options)


def unavailable_reason(method: str, target: Target) -> str | None:
    """Why `method` cannot run on `target` (with the command that fixes it), or None."""
    method = method.lower().strip()
    if method == "ar":
        return None
    try:
        mod = _module(method)
    except ModuleNotFoundError:
        return f"{LABELS.get(method, method)} is not implemented yet in this build."
    return mod.unavailable_reason(target)
