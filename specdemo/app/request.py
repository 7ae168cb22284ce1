"""A race request as it enters the app (page or API): every field checked at the edge, once, with a message that
names the allowed range, so nothing out of range reaches the engine, a drafter or the JSON encoder.

A race is AR against one or more methods; `/race` asks for one, `/race_all` (and the page's *Race all*) for every
method available on the model, or a chosen few.  Both arrive here through `checked_request`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdemo.app import public
from specdemo.precision import model_spec
from specdemo.drafters import DEFAULT_METHOD, REGISTRY, as_number, check_options, number_text
from specdemo.sampling import SamplingConfig
from specdemo.target import EMBEDDED

MAX_PROMPT_CHARS = 16_000  # before tokenising; the token limit itself comes from the model's context
MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 2.0
MAX_TOP_K = 1000
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes, and what JSON clients hold exactly
MAX_MODEL_CHARS = 256
RACE_ALL = "all"  # the method name a race of every available method exports


def modes() -> tuple[str, ...]:
    """The registered methods, in the order the page shows them."""
    return tuple(m.name for m in REGISTRY)


class UserError(Exception):
    """A problem the user can fix; its message is shown in the page."""


@dataclass
class RaceRequest:
    prompt: str
    methods: tuple[str, ...] = (DEFAULT_METHOD,)  # raced beside AR; with race_all, empty = every available one
    model: str = EMBEDDED
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    options: dict[str, dict] = field(default_factory=dict)  # method -> its checked options
    race_all: bool = False  # a race of every available method (or of `methods`): lanes and a board, not two panes

    @property
    def method(self) -> str:
        """What the export calls the race: its one method, or "all"."""
        return RACE_ALL if self.race_all else self.methods[0]

    def options_json(self) -> dict:
        """The settings as exported: the method's options, or race all's {method: options} where any were set."""
        if self.race_all:
            return {m: o for m, o in self.options.items() if o}
        return dict(self.options.get(self.methods[0], {}))


def _number(name: str, value, low: float, high: float, integer: bool, low_open: bool = False,
            meaning: str = "") -> float:
    """`value` as a number within [low, high] ((low, high] with `low_open`), or a UserError naming the range."""
    kind = "an integer" if integer else "a number"
    span = (f"above {number_text(low)} and at most {number_text(high)}" if low_open
            else f"from {number_text(low)} to {number_text(high)}")
    number = as_number(value)
    if (number is None or (integer and number != int(number)) or number < low or number > high
            or (low_open and number == low)):
        raise UserError(f"{name} must be {kind} {span}{meaning}; got {str(value)[:40]!r}.")
    return int(number) if integer else float(number)


def _text(name: str, value, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{name} must be text; got {type(value).__name__}.")
    if len(value) > limit:
        raise UserError(f"The {name.lower()} is {len(value):,} characters; this demo takes up to {limit:,}.")
    return value


def race_request(prompt, method=DEFAULT_METHOD, model=EMBEDDED, max_new_tokens=128, temperature=0.0, top_p=1.0,
                 top_k=0, seed=0, options=None) -> RaceRequest:
    """A checked race of AR against `method` from raw page or API values (an empty seed box means seed 0)."""
    method = _text("Mode", method, 40).lower().strip() or DEFAULT_METHOD
    if method not in modes():
        raise UserError(f"Unknown mode '{method}'. Choose one of: {', '.join(modes())}.")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise UserError(f"options must be a dict of drafter options, e.g. {{\"budget\": 16}}; got "
                        f"{type(options).__name__}.")
    return checked_request(prompt, (method,), model, max_new_tokens, temperature, top_p, top_k, seed,
                           {method: options}, race_all=False)


def race_all_request(prompt, model=EMBEDDED, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                     options=None, methods=None) -> RaceRequest:
    """A checked race of AR against every method available for the model: `options` maps a method to its options,
    `methods` (a list or a comma-separated string; empty = every method) names the lanes beside AR."""
    if methods in (None, ""):
        methods = ()
    elif isinstance(methods, str):
        methods = [m for m in methods.replace(" ", "").split(",") if m]
    if not isinstance(methods, (list, tuple)) or not all(isinstance(m, str) for m in methods):
        raise UserError(f"methods must be a list of method names from: {', '.join(modes())}; "
                        f"got {str(methods)[:60]!r}.")
    methods = tuple(dict.fromkeys(m.lower() for m in methods))
    if unknown := [m for m in methods if m not in modes()]:
        raise UserError(f"Unknown method {unknown[0]!r}. Choose from: {', '.join(modes())}.")
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise UserError('options must map a method to its options, e.g. {"rest": {"budget": 16}}; got '
                        f"{str(options)[:60]!r}.")
    if unknown := [m for m in options if m not in modes()]:
        raise UserError(f"options name an unknown method {unknown[0]!r}. Choose from: {', '.join(modes())}.")
    return checked_request(prompt, methods, model, max_new_tokens, temperature, top_p, top_k, seed, options,
                           race_all=True)


def checked_request(prompt, methods: tuple[str, ...], model, max_new_tokens, temperature, top_p, top_k, seed,
                    options: dict[str, dict], race_all: bool) -> RaceRequest:
    """The one place a request's fields and every method's options are checked (each option once per request)."""
    model = _text("Model", model, MAX_MODEL_CHARS).strip() or EMBEDDED
    try:
        model = model_spec(model)  # "name@bf16" / "name@int4": a CPU precision (precision.py)
    except ValueError as exc:
        raise UserError(f"Model '{model[:80]}': {exc}.") from None
    checked = {}
    for method in (methods or modes()) if race_all else methods:
        try:
            checked[method] = check_options(method, options.get(method) or {})
            public.check_options(method, checked[method])
        except (ValueError, public.PublicModeRefusal) as exc:
            raise UserError(str(exc)) from None
    sampling = SamplingConfig(
        temperature=_number("Temperature", temperature, 0, MAX_TEMPERATURE, False, meaning=" (0 = greedy)"),
        top_p=_number("Top-p", top_p, 0, 1, False, low_open=True),
        top_k=_number("Top-k", top_k, 0, MAX_TOP_K, True, meaning=" (0 = off)"),
        seed=_number("Seed", 0 if seed in (None, "") else seed, 0, MAX_SEED, True),
    )
    prompt = _text("Prompt", prompt, MAX_PROMPT_CHARS)
    if not prompt.strip():
        raise UserError("The prompt is empty: type something (or pick an example) and press Generate.")
    return RaceRequest(prompt=prompt, methods=tuple(methods), model=model,
                       max_new_tokens=_number("Max new tokens", max_new_tokens, 1, MAX_NEW_TOKENS, True),
                       sampling=sampling, options=checked, race_all=race_all)
