"""Honest clocks: the machinery that keeps a race's timings those of the decoders, not of the server around them.

A race charges each run only its own compute (`draft_s + verify_s`, measured by the engine around device-synchronised
work), so the page's speedup is the bench's.  On a CPU the server itself shares the cores with the steps being timed,
and each piece below removes one way it would otherwise slow them.  What each one guarantees:

- `gate.Gate` — one piece of model work at a time (races, benchmarks, model loads, datastore builds), first come first
  served, with a bounded line; the overflow is refused with a message.  Two races at once would each time the other.
- `model_thread` — all model work on one long-lived thread, so torch's OpenMP keeps one team of workers (several
  calling threads made libgomp sleep its workers between ops: AR ~25% slower than the bench).  The only thread
  that touches a model; the gate decides *when*, the model thread *where*.
- `quiet_queue` — Gradio's queue polls every 50 ms, and every 0.5 s while the gate is held, instead of every 1 ms
  (its idle loop's wake-ups took cores mid-step).
- `drawn` — a browser on the server's machine acknowledges each update once drawn (one that redraws the charts once
  they have their marks), and the race waits for it: the drawing happens between steps, charged to no run; the
  summary shows that wait as the page's share.
- `calm_trackers` — the page's early script slows Gradio's status-tracker frame loop (60 frames a second on an idle
  page, on the cores being timed).

`Target.lock` (specdemo/target.py) is not one of them: it guards a model's state against two callers at once in
library use (bench, scripts); inside the app the gate and the model thread already serialise all model work.
docs/honest-clocks.md has the measurements behind each.
"""
