"""The scripted API: `/race` (AR against one method) and `/race_all` (AR against every method, in lanes).

Both are one path: a checked request (request.py), the race loop (racing.py), one view of the record (record.py).
Their signatures and output keys are the public API; `api_markdown()` writes docs/api.md from these signatures, their
docstrings and the drafter registry (a test keeps the file equal to it), and the page's API tab shows the same text.
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterator

from specdemo.app.racing import STREAM_EVERY, run_race, throttled
from specdemo.app.record import race_view, refused_view
from specdemo.app.request import MAX_MODEL_CHARS, RaceRequest, UserError, race_all_request, race_request
from specdemo.drafters import DEFAULT_METHOD, REGISTRY, options
from specdemo.target import EMBEDDED


def race_api(prompt: str, method: str = DEFAULT_METHOD, model: str = EMBEDDED, max_new_tokens: int = 64,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             options: dict | None = None) -> dict:
    """Race plain decoding against `method` on `prompt`; streams a dict after every step, the last one final.
    `model`: "embedded", a hub id or a local folder, at a CPU precision with "@bf16" or "@int4" ("embedded@int4").

    Keys: `status` (queued | starting | running | done | stopped | error), `message`, `model`, `method`,
    `queue_wait_s` (seconds spent waiting for the requests ahead), `ar` and `spec` (`text`, `new_tokens`, `wall_time`
    (the run's own compute seconds), `tokens_per_s`, `decoding_steps`, `accept_lengths`, `tau`, `done`; `spec.spans`
    lists `{text, step, accepted_draft, source}`), `summary` (`speedup`, `tau`, `forwards`, `baseline_forwards`,
    `forwards_saved`, `identical`, `complete`, `first_difference`, `tie_gap`: AR's top-2 logit gap there) and, in
    the final dict, `run` (the export)."""
    yield from _stream(lambda: race_request(prompt, method, model, max_new_tokens, temperature, top_p, top_k, seed,
                                            options),
                       RaceRequest("", (str(method)[:40],)), model)


def race_all_api(prompt: str, model: str = EMBEDDED, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, options: dict | None = None,
                 methods: list[str] | None = None) -> dict:
    """Race plain decoding against every method available for the model (or those in `methods`), each in its own
    lane; streams a dict after every step, the last one final.  `options` maps a method to its options.

    Keys: `status`, `message`, `model`, `queue_wait_s`, `skipped` (`{method: why it cannot run on this model}`) and
    `lanes` (`{"ar" | method: {text, new_tokens, wall_time, tokens_per_s, decoding_steps, accept_lengths, tau, done,
    acceptance_by_depth}}`, the methods' lanes also with `speedup` and `identical`); the final dict adds `run`, the
    export with `board` (each method's summary against AR)."""
    yield from _stream(lambda: race_all_request(prompt, model, max_new_tokens, temperature, top_p, top_k, seed,
                                                options, methods),
                       RaceRequest("", (), race_all=True), model)


def _stream(check: Callable[[], RaceRequest], refused: RaceRequest, model) -> Iterator[dict]:
    """The one path behind both endpoints; a request refused at the edge gets one dict with status "error"."""
    try:
        req = check()
    except UserError as exc:
        yield refused_view(str(exc), refused, str(model)[:MAX_MODEL_CHARS])
        return
    for rec in throttled(run_race(req), STREAM_EVERY):
        yield race_view(rec)


ENDPOINTS = {"race": race_api, "race_all": race_all_api}

EXAMPLE = '''```python
from gradio_client import Client

client = Client("http://127.0.0.1:7860/")        # or "<user>/<space>" on Hugging Face
job = client.submit("Explain recursion in one paragraph.", "pld", "embedded", 64, 0.0, 1.0, 0, 0,
                    {"num_tokens": 10}, api_name="/race")
for update in job:                                 # streamed while the race runs
    print(update["status"], update["ar"]["new_tokens"], update["spec"]["new_tokens"])
final = job.outputs()[-1]
print(final["summary"]["speedup"], final["summary"]["tau"], final["summary"]["identical"])

final = client.predict("Explain recursion in one paragraph.", "embedded", 64, 0.0, 1.0, 0, 0,
                       {"rest": {"budget": 16}}, None, api_name="/race_all")
for method, lane in final["lanes"].items():
    print(method, lane["tokens_per_s"], lane.get("speedup"), lane["tau"], lane.get("identical"))
```'''


def _signature(name: str, fn: Callable) -> str:
    """`/name(param: type = default, ...)`, one parameter a line."""
    params = [f"    {p.name}: {p.annotation}" + ("" if p.default is p.empty else f" = {p.default!r}".replace("'", '"'))
              for p in inspect.signature(fn).parameters.values()]
    return f"/{name}(\n" + ",\n".join(params) + "\n) -> dict   # streamed: one dict after every step, the last final"


def methods_markdown() -> str:
    """Per registered method: name, what it does, and every option with its allowed values (from the drafters' own
    declarations, the same ones requests are checked against)."""
    lines = []
    for m in REGISTRY:
        lines.append(f"- `{m.name}` ({m.label}): {m.summary}")
        lines += [f"    - `{o.name}`: {o.allowed()} · {o.help}" for o in options(m.name)]
    return "\n".join(lines)


def api_markdown() -> str:
    """docs/api.md: the endpoints' signatures and docstrings, an example, and every method's options."""
    parts = ["# The scripted API", "",
             "Generated by `python -m specdemo.app.api` from the endpoints' signatures and the drafter registry; "
             "a test keeps this file equal to what the code says.", ""]
    for name, fn in ENDPOINTS.items():
        parts += [f"## `/{name}`", "", "```", _signature(name, fn), "```", "", inspect.cleandoc(fn.__doc__), ""]
    parts += ["## Example", "", EXAMPLE, "",
              "Errors (bad input, a full waiting line, a refused model) come back as a dict with "
              '`"status": "error"` and a `"message"` that names what is allowed, never as exceptions; '
              "`job.cancel()` stops a race.", "", "## Methods and their options", "", methods_markdown(), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "api.md"
    path.write_text(api_markdown())
    print(f"wrote {path}")
