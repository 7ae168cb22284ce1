"""Drafters: each proposes a draft tree per step; the engine verifies it.  This file is the one registry.

A drafter is a module or package `specdemo/drafters/<name>` that provides
    make(target, **options) -> Drafter        # raises DrafterUnavailable with the command that creates the artifact
    unavailable_reason(target) -> str | None  # None when usable on this model (cheap: no heavy loading)
    KNOBS: tuple[Knob, ...]                   # the options a user may set, with their ranges (page, API docs, bench)
    note(target) -> str | None                # optional: something the page should say about this model
plus one `Method` entry in REGISTRY below.  The page, the `/race` API, the bench and the CLI help all read REGISTRY.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from specdemo.engine import Drafter
from specdemo.target import Target


class DrafterUnavailable(RuntimeError):
    """A drafter's artifact (datastore, heads, adapter) is missing or wrong for this model; says how to make it."""


@dataclass(frozen=True)
class Knob:
    """One per-method setting, passed to `make(target, **{option: value})`.

    zero -- what a slider at 0 means: None (0 is not allowed), "omit" (leave the drafter's own default, e.g. REST's
    device-dependent budget) or a value to pass instead.
    """

    method: str
    option: str
    label: str
    minimum: int
    maximum: int
    value: int
    info: str = ""
    zero: str | None = None

    def resolve(self, value) -> tuple[bool, object]:
        """(pass it?, value) for a slider value."""
        v = int(value)
        if v == 0 and self.zero is not None:
            return (False, None) if self.zero == "omit" else (True, self.zero)
        return True, v


@dataclass(frozen=True)
class Method:
    name: str  # what requests and the bench call it
    label: str  # what people read
    summary: str  # one line for the page and the API docs
    default_rank: int  # which available method the page selects first (lowest wins)


REGISTRY: tuple[Method, ...] = (  # the order the page shows them in
    Method("rest", "REST", "drafts retrieved from a datastore of text and from the request itself", 0),
    Method("s4c", "S4C", "three draft heads on the target's features, a continuous verification tree", 2),
    Method("sdsat", "SDSAT", "adaptive tokens that draft the next tokens inside the verification forward", 3),
    Method("pld", "Prompt lookup", "copies what followed the last occurrence of the current n-gram", 1),
)
BY_NAME = {m.name: m for m in REGISTRY}
METHODS = ("ar",) + tuple(m.name for m in REGISTRY)  # ar: plain decoding, no drafter
LABELS = {"ar": "Autoregressive", **{m.name: m.label for m in REGISTRY}}


def module(method: str) -> ModuleType:
    """The drafter module of a registered method."""
    if method not in BY_NAME:
        raise ValueError(f"Unknown method '{method}'. Known: {', '.join(METHODS)}.")
    return importlib.import_module(f"specdemo.drafters.{method}")


def knobs(method: str) -> tuple[Knob, ...]:
    return tuple(module(method).KNOBS)


def all_knobs() -> tuple[Knob, ...]:
    """Every method's knobs in registry order (the page's sliders, in the order its handler reads them)."""
    return tuple(k for m in REGISTRY for k in knobs(m.name))


def note(method: str, target: Target) -> str | None:
    fn = getattr(module(method), "note", None)
    return fn(target) if fn else None


def make_drafter(method: str, target: Target, **options) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR)."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return module(method).make(target, **options)


def unavailable_reason(method: str, target: Target) -> str | None:
    """Why `method` cannot run on `target` (with the command that fixes it), or None."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return module(method).unavailable_reason(target)
