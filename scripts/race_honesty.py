"""Does the race stay honest when someone watches it?  The same prompt and method three ways, taken in turn:

    bench  -- specdemo.bench.run_bench in this process (no app, no page)
    api    -- the `/race` endpoint of a launched app, through gradio_client (the app, no page)
    page   -- the page in headless Chromium, driven by Playwright, on the same launched app

and AR tokens/s and the speedup of each, relative to the bench's.  The machine's speed drifts by more than 10% over
minutes, so the repeats go round robin (each repeat runs every way once, starting with a different way each time) and
the figure reported is the median over the repeats of each way's ratio to the bench run of the same repeat (minutes
apart at most); the ratio of the medians is printed beside it.  Every way decodes at one CPU precision, `--precision`
(default: the page's, precision.default_precision), the page's picker set to it.  With --race-all the api and page
ways race all the methods at once in lanes (`/race_all`, the page's Race all) against one bench run of them all.  The
browser is open throughout, as it is for someone watching.  Run it alone on the machine (every process here shares
the cores):

    .venv/bin/python scripts/race_honesty.py --methods rest,s4c --example Code --max-new-tokens 128 --repeats 5
    .venv/bin/python scripts/race_honesty.py --race-all --methods rest,s4c,sdsat,pld --example Code --repeats 5

Needs Debian's chromium (`make browser`).  Prints one line per way and method, then a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import statistics
from contextlib import contextmanager
from typing import Iterator

import torch
from app_process import app_process  # scripts/app_process.py, beside this file

from specdemo.app.page import EXAMPLES
from specdemo.bench import run_bench
from specdemo.precision import PRECISIONS, default_precision
from specdemo.target import load_target

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


WAYS = ("bench", "api", "page")


def rotated(ways: tuple[str, ...], rep: int) -> tuple[str, ...]:
    """The ways in the order of repeat `rep`: each repeat starts with the next way, so none always runs first."""
    k = rep % len(ways)
    return ways[k:] + ways[:k]


def compare(runs: dict[str, list[dict]], keys: list[str]) -> dict:
    """Per way: the medians of `keys`; for api and page also `vs_bench` (the median over repeats of the ratio to the
    same repeat's bench run, minus 1: the figure the bar is about) and `vs_bench_medians` (ratio of the medians)."""
    med = {w: {k: statistics.median(r[k] for r in runs[w]) for k in keys} for w in runs}
    out = {w: {k: round(v, 3) for k, v in med[w].items()} for w in med}
    for w in ("api", "page"):
        out[w]["vs_bench"] = {k: round(statistics.median(r[k] / b[k] for r, b in zip(runs[w], runs["bench"])) - 1, 3)
                              for k in keys}
        out[w]["vs_bench_medians"] = {k: round(med[w][k] / med["bench"][k] - 1, 3) for k in keys}
    return out


def by_bench(target, prompt: str, method: str, tokens: int) -> dict:
    result = run_bench(target, [method], [{"id": "example", "prompt": prompt}], tokens)
    return {"ar_tps": result["methods"]["ar"]["tokens_per_s"], "speedup": result["methods"][method]["speedup"]}


def by_api(url: str, prompt: str, method: str, tokens: int, model: str) -> dict:
    from gradio_client import Client

    final = Client(url, verbose=False).predict(prompt, method, model, tokens, 0.0, 1.0, 0, 0, None,
                                               api_name="/race")
    assert final["status"] == "done", final["message"]
    return {"ar_tps": final["ar"]["tokens_per_s"], "speedup": final["summary"]["speedup"]}


@contextmanager
def watched_app(precision: str) -> Iterator[tuple[str, object]]:
    """A launched app and a headless Chromium page open on it, the model loaded at `precision`: (url, page)."""
    from playwright.sync_api import sync_playwright

    with app_process() as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector(".sd-chip:not(.sd-chip-bad)", timeout=300_000)
        precision_picker = page.locator("#sd-precision label", has_text=precision)
        if "selected" not in (precision_picker.get_attribute("class") or ""):
            loaded = page.inner_text(".sd-chip")
            precision_picker.click()  # the page loads the model at that precision; the header then describes it
            page.wait_for_function("(was) => { const c = document.querySelector('.sd-chip');"
                                   " return c && !c.classList.contains('sd-chip-bad') && c.innerText !== was; }",
                                   arg=loaded, timeout=300_000)
        try:
            yield url, page
        finally:
            browser.close()


def _race_in_page(page, example: str, tokens: int, button: str, done_selector: str):
    """Pick the example, set max new tokens, press `button`, wait for the end: (the done summary, its page clock)."""
    page.get_by_role("button", name=example, exact=True).click()
    page.locator("#sd-settings .label-wrap").first.click()
    box = page.get_by_label("number input for Max new tokens")
    box.fill(str(tokens))
    box.press("Enter")
    page.locator("#sd-settings .label-wrap").first.click()
    page.locator(button).click()
    page.wait_for_selector('#sd-summary [data-status="running"]', timeout=300_000)
    done = page.wait_for_selector(done_selector, timeout=900_000)
    clock = {k: float(done.get_attribute(f"data-{k.replace('_', '-')}")) for k in ("page_s", "wall_s", "drawn")}
    return done, clock


def by_page(page, example: str, method_label: str, tokens: int) -> dict:
    page.locator("#sd-mode label", has_text=method_label).click()
    done, clock = _race_in_page(page, example, tokens, "#sd-generate", '#sd-summary [data-status="done"]')
    out = {"ar_tps": float(done.get_attribute("data-ar-tps")), "speedup": float(done.get_attribute("data-speedup")),
           **clock}
    page.wait_for_timeout(1000)  # the last plots draw before the next race starts
    return out


def all_by_bench(target, prompt: str, methods: list[str], tokens: int) -> dict:
    result = run_bench(target, methods, [{"id": "example", "prompt": prompt}], tokens)
    return {"ar_tps": result["methods"]["ar"]["tokens_per_s"],
            **{m: result["methods"][m]["speedup"] for m in methods}}


def all_by_api(url: str, prompt: str, methods: list[str], tokens: int, model: str) -> dict:
    from gradio_client import Client

    final = Client(url, verbose=False).predict(prompt, model, tokens, 0.0, 1.0, 0, 0, None, methods,
                                               api_name="/race_all")
    assert final["status"] == "done", final["message"]
    return {"ar_tps": final["lanes"]["ar"]["tokens_per_s"], **{m: final["lanes"][m]["speedup"] for m in methods}}


def all_by_page(page, example: str, methods: list[str], tokens: int) -> dict:
    _, clock = _race_in_page(page, example, tokens, "#sd-race-all", '#sd-summary [data-status="done"][data-lanes]')
    rows = {r.get_attribute("data-lane"): r for r in page.query_selector_all("#sd-lanes table.sd-board tbody tr")}
    out = {"ar_tps": float(rows["ar"].get_attribute("data-tps")),
           **{m: float(rows[m].get_attribute("data-speedup")) for m in methods}, **clock}
    page.wait_for_timeout(1000)
    return out


def main_race_all(args, target, prompt: str, methods: list[str]) -> int:
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    keys = ["ar_tps", *methods]
    model = f"embedded@{args.precision}"
    with watched_app(args.precision) as (url, page):
        all_by_bench(target, prompt, ["ar", *methods], 16)
        all_by_api(url, prompt, methods, 16, model)
        for rep in range(args.repeats):
            for way in rotated(WAYS, rep):
                if way == "bench":
                    r = all_by_bench(target, prompt, ["ar", *methods], args.max_new_tokens)
                elif way == "api":
                    r = all_by_api(url, prompt, methods, args.max_new_tokens, model)
                else:
                    r = all_by_page(page, args.example, methods, args.max_new_tokens)
                runs[way].append(r)
                print(f"{rep + 1}/{args.repeats} {way:<5} all", {k: round(v, 3) for k, v in r.items()},
                      flush=True)
    summary = compare(runs, keys)
    summary["page"]["page_share"] = round(statistics.median(r["page_s"] / r["wall_s"] for r in runs["page"]), 3)
    print(json.dumps({"example": args.example, "precision": args.precision, "max_new_tokens": args.max_new_tokens,
                      "repeats": args.repeats, "race_all": summary}, indent=1))
    ok = all(abs(summary["page"]["vs_bench"][k]) <= 0.10 for k in keys)
    print("page within 10% of the bench:", "yes" if ok else "no")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="rest,s4c")
    ap.add_argument("--example", default="Code", help="one of the page's example buttons")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="races per way and method; the median is reported")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--race-all", action="store_true", help="race all the methods at once, in lanes")
    ap.add_argument("--precision", choices=PRECISIONS, default=default_precision(),
                    help="the CPU precision of every way (default: the page's)")
    args = ap.parse_args(argv)
    prompt = dict(EXAMPLES)[args.example]
    methods = args.methods.split(",")
    if args.race_all:
        torch.set_num_threads(args.threads)
        return main_race_all(args, load_target("embedded", precision=args.precision), prompt, methods)
    labels = {"rest": "REST", "s4c": "S4C", "sdsat": "SDSAT", "pld": "Prompt lookup"}
    runs: dict[str, dict[str, list[dict]]] = {w: {m: [] for m in methods} for w in WAYS}

    torch.set_num_threads(args.threads)
    target = load_target("embedded", precision=args.precision)
    model = f"embedded@{args.precision}"
    with watched_app(args.precision) as (url, page):
        for m in methods:  # warm-up: each way's model, the drafter's artifacts, kernels
            by_bench(target, prompt, m, 16)
            by_api(url, prompt, m, 16, model)
        # round robin: the machine's speed drifts by more than 10% over minutes, and each way gets the same share
        for rep in range(args.repeats):
            for m in methods:
                for way in rotated(WAYS, rep):
                    if way == "bench":
                        r = by_bench(target, prompt, m, args.max_new_tokens)
                    elif way == "api":
                        r = by_api(url, prompt, m, args.max_new_tokens, model)
                    else:
                        r = by_page(page, args.example, labels[m], args.max_new_tokens)
                    runs[way][m].append(r)
                    print(f"{rep + 1}/{args.repeats} {way:<5} {m}", {k: round(v, 3) for k, v in r.items()},
                          flush=True)

    summary = {}
    for m in methods:
        summary[m] = compare({w: runs[w][m] for w in runs}, ["ar_tps", "speedup"])
        shares = [r["page_s"] / r["wall_s"] for r in runs["page"][m]]
        summary[m]["page"]["page_share"] = round(statistics.median(shares), 3)
    print(json.dumps({"example": args.example, "precision": args.precision, "max_new_tokens": args.max_new_tokens,
                      "repeats": args.repeats, "results": summary}, indent=1))
    ok = all(abs(summary[m]["page"]["vs_bench"][k]) <= 0.10 for m in methods for k in ("ar_tps", "speedup"))
    print("page within 10% of the bench:", "yes" if ok else "no")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
