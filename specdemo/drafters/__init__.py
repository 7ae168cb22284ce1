"""Drafters: each proposes a draft tree per step; the engine verifies it.  `make_drafter` is the one registry."""
from __future__ import annotations

from ..engine import Drafter
from ..models import Target


class DrafterUnavailable(RuntimeError):
    """A drafter's artifact (datastore, heads, adapter) is missing for this model; the message says how to make it."""


METHODS = ("ar", "pld")


def make_drafter(method: str, target: Target, **options) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR)."""
    method = method.lower()
    if method == "ar":
        return None
    if method == "pld":
        from .pld import PromptLookupDrafter

        return PromptLookupDrafter(**options)
    raise ValueError(f"Unknown method '{method}'. Known: {', '.join(METHODS)}.")
