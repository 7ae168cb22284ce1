"""Load and soak on loopback: launch the app, drive it with N concurrent gradio_client users (mixed methods, some
cancelling mid-race, some with bad inputs), then many sequential races; report what was served, refused with a
message or failed, the queue waits, and the server's memory before and after.

    .venv/bin/python scripts/soak.py --users 30 --sequential 200

Outcomes: served (a race that ran: done, or stopped by its own cancel), refused (status "error" with a message: bad
input, or the waiting line full), failed (an exception, no answer, or an error without a message).  RSS is the
server process's resident memory (/proc), taken after a warm-up race of every method and again at the end.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path

from app_process import app_process

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("pld", "rest", "s4c", "sdsat")
PROMPTS = ("Write a Python function that reverses a list.", "Explain what a hash table is in two sentences.",
           "Summarise: the cat sat on the mat because the mat was warm.", "List three prime numbers and say why.")
BAD = (  # (kwargs, a piece of the message that must come back)
    (dict(seed=2**70), "Seed must be an integer"),
    (dict(options={"budget": "abc"}), "is not allowed"),
    (dict(top_p=0.0), "Top-p must be"),
    (dict(options={"warp": 1}), "has no option"),
    (dict(max_new_tokens=10**6), "Max new tokens must be"),
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def race(client, prompt: str, method: str, tokens: int = 24, cancel_after: int | None = None, **kw) -> dict:
    """One /race call; returns {"outcome", "wait", "message"}."""
    args = dict(prompt=prompt, method=method, model="embedded", max_new_tokens=tokens, temperature=0.0, top_p=1.0,
                top_k=0, seed=0, options=None) | kw
    t0 = time.monotonic()
    try:
        job = client.submit(*args.values(), api_name="/race")
        last, running = None, 0
        for update in job:
            last = update
            if update and update.get("status") == "running":
                running += 1
                if cancel_after is not None and running >= cancel_after:
                    job.cancel()
                    return {"outcome": "served", "wait": update.get("queue_wait_s"), "message": "cancelled",
                            "seconds": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001 -- every way of failing is counted, not raised
        return {"outcome": "failed", "wait": None, "message": f"{type(exc).__name__}: {exc}",
                "seconds": time.monotonic() - t0}
    if not isinstance(last, dict):
        return {"outcome": "failed", "wait": None, "message": f"no final dict ({last!r})"}
    status, message = last.get("status"), last.get("message")
    if status in ("done", "stopped"):
        outcome = "served"
    elif status == "error" and message:
        outcome = "refused"
    else:
        outcome = "failed"
    return {"outcome": outcome, "wait": last.get("queue_wait_s"), "message": message, "status": status,
            "seconds": time.monotonic() - t0}


def summarise(results: list[dict]) -> dict:
    waits = sorted(r["wait"] for r in results if r["outcome"] == "served" and r.get("wait") is not None)
    pick = lambda q: round(waits[min(len(waits) - 1, int(q * len(waits)))], 2) if waits else None  # noqa: E731
    out = {k: sum(r["outcome"] == k for r in results) for k in ("served", "refused", "failed")}
    out.update(requests=len(results), queue_wait_p50_s=pick(0.5), queue_wait_p95_s=pick(0.95))
    out["refusals"] = sorted({(r["message"] or "")[:60] for r in results if r["outcome"] == "refused"})
    out["failures"] = [r["message"] for r in results if r["outcome"] == "failed"][:5]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=30)
    ap.add_argument("--sequential", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from gradio_client import Client

    rng = random.Random(args.seed)
    report: dict = {"users": args.users, "sequential": args.sequential, "tokens": args.tokens}
    with app_process({"SPECDEMO_PUBLIC": "0"}) as (url, app):
        client = Client(url, verbose=False)
        for m in METHODS:  # warm-up: every method's artifacts and cost curves loaded once
            assert race(client, PROMPTS[0], m, 8)["outcome"] == "served"
        report["rss_after_warmup_mb"] = round(rss_mb(app.pid), 1)

        results: list[dict] = [None] * args.users  # type: ignore[list-item]
        plans = []
        for i in range(args.users):
            kind = rng.choice(["race", "race", "race", "cancel", "bad"])
            plans.append(kind)

        def user(i: int) -> None:
            c = Client(url, verbose=False)
            if plans[i] == "bad":
                kw, expect = BAD[i % len(BAD)]
                r = race(c, PROMPTS[i % 4], METHODS[i % 4], args.tokens, **kw)
                if r["outcome"] == "refused" and expect not in (r["message"] or ""):
                    r = dict(r, outcome="failed", message=f"wrong message: {r['message']}")
            else:
                r = race(c, PROMPTS[i % 4], METHODS[i % 4], args.tokens,
                         cancel_after=2 if plans[i] == "cancel" else None)
            results[i] = dict(r, plan=plans[i])

        t0 = time.monotonic()
        threads = [threading.Thread(target=user, args=(i,)) for i in range(args.users)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join()
        report["concurrent"] = summarise(results) | {"plans": {k: plans.count(k) for k in set(plans)},
                                                      "seconds": round(time.monotonic() - t0, 1)}
        print("concurrent:", json.dumps(report["concurrent"]), flush=True)
        time.sleep(5)  # cancelled races let go of the gate

        report["rss_before_sequential_mb"] = round(rss_mb(app.pid), 1)
        seq = []
        for i in range(args.sequential):
            seq.append(race(client, PROMPTS[i % 4], METHODS[i % 4], args.tokens))
            if (i + 1) % 25 == 0:
                print(f"sequential: {i + 1}/{args.sequential}, rss {rss_mb(app.pid):.0f} MB", flush=True)
        report["sequential_races"] = summarise(seq) | {"mean_race_s": round(statistics.mean(r.get("seconds", 0)
                                                                                           for r in seq), 2)}
        report["rss_end_mb"] = round(rss_mb(app.pid), 1)
        report["rss_growth_mb"] = round(report["rss_end_mb"] - report["rss_after_warmup_mb"], 1)
        report["rss_growth_sequential_mb"] = round(report["rss_end_mb"] - report["rss_before_sequential_mb"], 1)
    print(json.dumps(report, indent=1))
    ok = report["concurrent"]["failed"] == 0 and report["sequential_races"]["failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
