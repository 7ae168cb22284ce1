"""Drafters: each proposes a draft tree per step; the engine verifies it.  This file is the one registry.

A drafter is a module or package `specdemo/drafters/<name>` that provides
    make(target, **options) -> Drafter        # raises DrafterUnavailable with the command that creates the artifact
    unavailable_reason(target) -> str | None  # None when usable on this model (cheap: no heavy loading)
    OPTIONS: tuple[Option, ...]               # every option `make` takes: type, allowed values, help (checked here)
    KNOBS: tuple[Knob, ...]                   # the options the page shows as sliders
    note(target) -> str | None                # optional: something the page should say about this model
plus one `Method` entry in REGISTRY below.  The page, the `/race` API, the bench and the CLI help all read REGISTRY.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from specdemo.engine import Drafter
from specdemo.target import Target


class DrafterUnavailable(RuntimeError):
    """A drafter's artifact (datastore, heads, adapter) is missing or wrong for this model; says how to make it."""


@dataclass(frozen=True)
class Option:
    """One option of a drafter's `make`, as a request may set it: its type and allowed values.

    kind: "int", "float", "bool", "choice" (one of `choices`), "counts" (integers in the range, comma-separated or a
    list) or "path" (a file, folder or hub id; refused in the public mode).  `special`: words accepted besides the
    range or kind (e.g. "auto", "default", "none").
    """

    name: str
    kind: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    special: tuple[str, ...] = ()
    help: str = ""

    def allowed(self) -> str:
        """The allowed values in words, for messages and the API docs."""
        if self.kind in ("int", "float"):
            word = "an integer" if self.kind == "int" else "a number"
            if self.minimum is not None and self.maximum is not None:
                text = f"{word} from {number_text(self.minimum)} to {number_text(self.maximum)}"
            elif self.minimum is not None:
                text = f"{word} >= {number_text(self.minimum)}"
            else:
                text = word
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "counts":
            text = f"integers from {number_text(self.minimum)} to {number_text(self.maximum)}, comma-separated"
        else:
            text = "a folder, file or hub id"
        return text + "".join(f" or {w!r}" for w in self.special)

    def check(self, value):
        """The value as `make` takes it; ValueError naming the allowed values otherwise."""
        bad = ValueError(f"option {self.name}={value!r} is not allowed: give {self.allowed()}.")
        if isinstance(value, str) and value.strip().lower() in self.special:
            return value.strip().lower()
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise bad
        if self.kind == "choice":
            if isinstance(value, str) and value.strip().lower() in self.choices:
                return value.strip().lower()
            raise bad
        if self.kind == "counts":
            items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
            numbers = [as_number(x) for x in items if not (isinstance(x, str) and not x.strip())]
            if not numbers or len(numbers) > 32 or any(
                    n is None or n != int(n) or not self.minimum <= n <= self.maximum for n in numbers):
                raise bad
            return [int(n) for n in numbers]
        if self.kind == "path":
            if isinstance(value, (str, Path)) and str(value).strip() and len(str(value)) <= 4096:
                return str(value).strip()
            raise bad
        number = as_number(value)
        if number is None or (self.kind == "int" and number != int(number)):
            raise bad
        if (self.minimum is not None and number < self.minimum) or (self.maximum is not None and number > self.maximum):
            raise bad
        return int(number) if self.kind == "int" else float(number)


def number_text(x: float) -> str:
    """A bound as people write it: 64, not 64.0; 0.5, not 0.500000."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def as_number(value) -> int | float | None:
    """A finite int or float, or a string of one (an integer string stays an exact int, so 2**63 - 1 survives);
    None for anything else, booleans included.  Requests from JSON and from forms arrive as either."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        for parse in (int, float):
            try:
                value = parse(value.strip())
                break
            except ValueError:
                continue
        else:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


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
        """(pass it?, value) for a slider value; the value itself is checked later, against the method's Option."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0 and self.zero is not None:
            return (False, None) if self.zero == "omit" else (True, self.zero)
        return True, int(value) if isinstance(value, float) and value.is_integer() else value


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


def options(method: str) -> tuple[Option, ...]:
    return tuple(module(method).OPTIONS)


def check_options(method: str, values: dict) -> dict:
    """`values` checked against the method's declared options: unknown names and values out of range raise a
    ValueError that lists what is allowed; the result holds the values as `make` takes them."""
    if method == "ar":
        if values:
            raise ValueError("Autoregressive decoding takes no options.")
        return {}
    declared = {o.name: o for o in options(method)}
    unknown = [name for name in values if name not in declared]
    if unknown:
        listing = "; ".join(f"{o.name} ({o.allowed()})" for o in declared.values())
        raise ValueError(f"{LABELS[method]} has no option {', '.join(map(repr, unknown))}. Its options: {listing}.")
    try:
        return {name: declared[name].check(v) for name, v in values.items()}
    except ValueError as exc:
        raise ValueError(f"{LABELS[method]}: {exc}") from None


def knobs(method: str) -> tuple[Knob, ...]:
    return tuple(module(method).KNOBS)


def all_knobs() -> tuple[Knob, ...]:
    """Every method's knobs in registry order (the page's sliders, in the order its handler reads them)."""
    return tuple(k for m in REGISTRY for k in knobs(m.name))


def note(method: str, target: Target) -> str | None:
    fn = getattr(module(method), "note", None)
    return fn(target) if fn else None


def make_drafter(method: str, target: Target, **values) -> Drafter | None:
    """A fresh drafter for `method` on `target` (None for plain AR), its options checked against its declarations."""
    method = method.lower().strip()
    values = check_options(method, values)
    if method == "ar":
        return None
    return module(method).make(target, **values)


def unavailable_reason(method: str, target: Target) -> str | None:
    """Why `method` cannot run on `target` (with the command that fixes it), or None."""
    method = method.lower().strip()
    if method == "ar":
        return None
    return module(method).unavailable_reason(target)
