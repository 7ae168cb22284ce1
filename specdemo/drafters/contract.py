"""The drafter contract: what a drafter module declares and the types those declarations are made of.

A drafter module imports from here, never from the registry (`specdemo.drafters`): the registry loads drafter modules
by name, so a drafter importing it back would be an import cycle that no static check sees.

A drafter is a module or package that provides
    make(target, **options) -> Drafter        # raises DrafterUnavailable with the command that creates the artifact
    unavailable_reason(target) -> str | None  # None when usable on this model (cheap: no heavy loading)
    OPTIONS: tuple[Option, ...]               # every option `make` takes: type, allowed values, help (checked once)
    KNOBS: tuple[Knob, ...]                   # the options the page shows as sliders
    SOURCES: tuple[DraftSource, ...]          # every name it puts into DraftTree.sources
    note(target) -> str | None                # optional: something the page should say about this model
and one `Method` entry in the registry (`specdemo.drafters.register`).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path


class DrafterUnavailable(RuntimeError):
    """A drafter's artifact (datastore, heads, adapter) is missing or wrong for this model; says how to make it."""


@dataclass(frozen=True)
class Method:
    """One registry entry: a drafter as requests, the page, the bench and the plots name it."""

    name: str  # what requests and the bench call it
    label: str  # what people read
    summary: str  # one line for the page and the API docs
    default_rank: int  # which available method the page selects first (lowest wins)
    colour: str  # its series colour in the plots
    module: str  # the dotted path of its drafter module or package (what the registry imports)


@dataclass(frozen=True)
class DraftSource:
    """A name a drafter puts into `DraftTree.sources`, and how the page shows spans drafted from it."""

    name: str  # the string in DraftTree.sources (and the calibration's table key)
    label: str  # what people read in the legend
    colour: str  # background of such a span, light theme
    dark: str  # background of such a span, dark theme


# Every drafter that copies from the request (prompt + output so far) labels those nodes with this one source.
PROMPT = DraftSource("prompt", "the prompt", "#fbcfe8", "#831843")


@dataclass(frozen=True)
class Option:
    """One option of a drafter's `make`, as a request may set it: its type and allowed values.

    kind: "int", "float", "bool", "choice" (one of `choices`), "counts" (integers in the range, comma-separated or a
    list) or "path" (a file, folder or hub id; refused in the public mode).  `special`: words accepted besides the
    range or kind (e.g. "auto", "default", "none").  `aliases`: former names, still accepted with a DeprecationWarning
    so that saved requests and bench command lines keep working after a rename.
    """

    name: str
    kind: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    special: tuple[str, ...] = ()
    help: str = ""
    aliases: tuple[str, ...] = ()

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


def renamed_options(declared: tuple[Option, ...], values: dict, owner: str) -> dict:
    """`values` with every former option name (an Option's `aliases`) replaced by the current one, each with a
    DeprecationWarning; ValueError when a value comes under both names.  `owner` names the drafter in messages."""
    current = {alias: o.name for o in declared for alias in o.aliases}
    out: dict = {}
    for name, value in values.items():
        new = current.get(name)
        if new is None:
            out[name] = value
            continue
        if new in values:
            raise ValueError(f"{owner}: give {new} only ({name} is its former name).")
        warnings.warn(f"{owner}: option {name} is now called {new}; the old name will go away.",
                      DeprecationWarning, stacklevel=3)
        out[new] = value
    return out


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
    """One per-method slider on the page, passed to `make(target, **{option: value})`.

    zero_keeps_default -- a slider at 0 leaves the option out, so the drafter's own default applies (e.g. REST's
    device-dependent budget); otherwise 0 is passed on like any value and checked against the option.
    """

    method: str
    option: str
    label: str
    minimum: int
    maximum: int
    value: int
    info: str = ""
    zero_keeps_default: bool = False

    def resolve(self, value) -> tuple[bool, object]:
        """(pass it?, value) for a slider value; the value itself is checked later, against the method's Option."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0 and self.zero_keeps_default:
            return False, None
        return True, int(value) if isinstance(value, float) and value.is_integer() else value
