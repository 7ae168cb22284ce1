"""Where one AR step's time goes on a GPU: the replayed decoder graph (GPU time), the eager work the step does around
it (its inputs written, the LM head, the target's choice synchronised), and the engine's Python around the step.

    python scripts/gpu_step_breakdown.py [--model embedded] [--dtype float32] [--context 256] [--tokens 128]

* engine: `run_to_end` with no drafter (AR, static steps, CUDA graphs) on a code prompt, milliseconds per generated
  token (the prefill included, as the bench counts it);
* step: `verify.trial_forward` with no draft through the same pooled graphs (inputs written, replay, LM head, sync);
* graph: the AR bucket's captured graph replayed alone back to back, timed by CUDA events (the GPU's time);
* kernels: the GPU kernels one eager static step launches (what the graph holds), and their summed GPU time.
Each the fastest of `--repeats`, after a warm-up.  Prints one JSON line; with --trace, torch.profiler's table of one
engine run's busiest operations too.
"""
from __future__ import annotations

import argparse
import json

import torch
from step_breakdown import fastest  # this folder's CPU breakdown: the same "fastest of n" timing

from specdemo.budget import trial_cache
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.target import load_target
from specdemo.tree import DraftTree, TreeBuffers
from specdemo.verify import trial_forward


def fastest_ms(fn, repeats: int) -> float:
    return 1e3 * fastest(fn, repeats)


def replay_ms(steps, buf: TreeBuffers, ids: list[int], n: int = 200) -> float:
    """GPU milliseconds of the AR bucket's graph replayed back to back (CUDA events)."""
    steps.forward([ids[-1]], buf, len(ids) - 1)  # captured here if the curve's warm-up did not
    graph = steps.graphs[1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trace", default=None, help="write torch.profiler's table of one engine run to this file")
    args = ap.parse_args(argv)
    t = load_target(args.model, args.device, args.dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 30000, (args.context,), generator=g).tolist()
    prompt = t.encode_prompt("Write a Python function that parses an ISO 8601 date string and returns the weekday, "
                             "with a docstring and three doctest examples.")
    cfg = GenerationConfig(max_new_tokens=args.tokens)
    made = len(run_to_end(t, prompt, None, cfg)[0])

    def engine() -> None:
        run_to_end(t, prompt, None, cfg)
    engine_ms = fastest_ms(engine, args.repeats) / made

    with t.lock, trial_cache(t, ids[:-1], 0) as (cache, steps):
        step_ms = fastest_ms(lambda: trial_forward(t, cache, ids[-1], DraftTree.empty(), steps), args.repeats * 20)
        buf = TreeBuffers.build(DraftTree.empty(), len(ids) - 1, t.device)
        graph_ms = replay_ms(steps, buf, ids) if hasattr(steps, "graphs") else None
        eager = getattr(steps, "steps", steps)
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                eager.forward([ids[-1]], buf, len(ids) - 1)
                t.sync()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            n_kernels, kernel_ms = len(kernels), round(sum(e.device_time for e in kernels) / 1e3, 3)
        except Exception as exc:  # the breakdown's other numbers stand without it
            n_kernels, kernel_ms = None, repr(exc)[:200]
        cache.keep(len(ids) - 1, [])
    out = {"model": t.name, "device": torch.cuda.get_device_name() if t.device.type == "cuda" else "cpu", "dtype": args.dtype, "context": args.context, "engine_tokens": made,
           "engine_ms_per_token": round(engine_ms, 3), "step_ms": round(step_ms, 3), "graph_ms": graph_ms and round(graph_ms, 3),
           "kernels_per_step": n_kernels, "kernel_gpu_ms": kernel_ms,
           "tok_s": round(1e3 / engine_ms, 1)}
    print(json.dumps(out))
    if args.trace:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            engine()
        with open(args.trace, "w") as f:
            f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
            f.write("\n")
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
