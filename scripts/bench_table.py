"""Print a bench JSON (python -m specdemo bench --json ...) as a markdown table for the README."""
import json
import sys

fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(f"{r['model']} ({r['dtype']}) on {r['device']}, {r['prompts']} prompts, max_new_tokens {r['max_new_tokens']}\n")
    print("| method | tok/s | speedup | tau | identical | draft ms | verify ms |")
    print("|---|---|---|---|---|---|---|")
    for m, x in r["methods"].items():
        print(f"| {m} | {fmt(x['tokens_per_s'], '.2f')} | {fmt(x['speedup'], '.2f')} | {fmt(x['tau'], '.2f')} | "
              f"{fmt(x['identical'], '.2f')} | {fmt(x['draft_ms'], '.2f')} | {fmt(x['verify_ms'], '.1f')} |")
    print()
