"""Print a bench JSON (python -m specdemo bench --json ...) as markdown tables for the README: the overall table and,
when the run had prompt groups (Spec-Bench tasks), a per-group table of speedup / tau per method."""
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
    if r.get("groups"):  # bench JSONs written before per-group summaries have no "groups"
        methods = list(r["methods"])
        cell = lambda x: f"{fmt(x.get('speedup'), '.2f')}× / {fmt(x.get('tau'), '.2f')}" if x else "–"  # noqa: E731
        print("Per group, speedup × / tau (same formulas over the group's prompts):\n")
        print("| group | prompts | " + " | ".join(methods) + " |")
        print("|---" * (len(methods) + 2) + "|")
        for g, by_m in r["groups"].items():
            n = max((x["prompts"] for x in by_m.values()), default=0)
            print(f"| {g} | {n} | " + " | ".join(cell(by_m.get(m)) for m in methods) + " |")
        print(f"| overall | {r['prompts']} | " + " | ".join(cell(r["methods"][m]) for m in methods) + " |")
        print()
