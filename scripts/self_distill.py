"""Self-distillation: the embedded model's own greedy answers to the project's prompt set (specdemo/corpus.py).

    nohup nice -n 5 .venv/bin/python scripts/self_distill.py > /tmp/selfdistill.log 2>&1 &

Writes assets/corpus/selfdistill.jsonl.gz: a header line, then one record per prompt
    {"id": ..., "prompt_ids": [chat-templated input ids], "answer_ids": [greedy output ids], "finish": "eos"|"length"}
Token ids only (decode with the target's tokenizer), so the file stays small.  Resumable: prompts already in the file
are skipped, and the file is rewritten atomically after every batch, so a killed run leaves a usable partial corpus.
Used by the REST default datastore and by the S4C / SDSAT trainers.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdemo.corpus import PROMPTS_PATH, SELFDISTILL_PATH, load_prompts  # noqa: E402

FORMAT = "specdemo-selfdistill"
VERSION = 1


def read_corpus(path: Path) -> tuple[dict | None, list[dict]]:
    """(header, records) of a self-distilled corpus file; (None, []) when it does not exist."""
    if not path.exists():
        return None, []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file")
    return lines[0], lines[1:]


def write_corpus(path: Path, header: dict, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(header) + "\n")
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, default=PROMPTS_PATH)
    ap.add_argument("--out", type=Path, default=SELFDISTILL_PATH)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    ap.add_argument("--minutes", type=float, default=0, help="stop starting new batches after this long (0 = no limit)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from specdemo.models import load_target

    target = load_target(args.model, device="cpu", dtype="float32")
    tok = target.tokenizer
    prompts = load_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    header = {"format": FORMAT, "version": VERSION, "model": target.name, "tokenizer": target.identity,
              "max_new_tokens": args.max_new_tokens, "decoding": "greedy, batched, left-padded, chat template",
              "prompts_sha256": hashlib.sha256(args.prompts.read_bytes()).hexdigest()[:16]}
    old_header, records = read_corpus(args.out)
    if old_header and (old_header["tokenizer"] != header["tokenizer"]
                       or old_header["max_new_tokens"] != header["max_new_tokens"]):
        raise SystemExit(f"{args.out} was made with another tokenizer or length; move it away to start over")
    # a prompt whose text changed since its answer was made is answered again
    current = {p["id"]: p["prompt"] for p in load_prompts(args.prompts)}
    kept = [r for r in records if r["id"] in current and r["prompt_ids"] == target.encode_prompt(current[r["id"]])]
    if len(kept) != len(records):
        print(f"dropping {len(records) - len(kept)} answers whose prompt changed", flush=True)
    records = kept
    done = {r["id"] for r in records}
    todo = [p for p in prompts if p["id"] not in done]
    print(f"{len(done)} prompts done, {len(todo)} to go", flush=True)

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = sorted(target.eos_ids)
    t_start = time.time()
    n_tokens = sum(len(r["answer_ids"]) for r in records)
    for b in range(0, len(todo), args.batch_size):
        if args.minutes and time.time() - t_start > args.minutes * 60:
            print("time budget reached; stopping (resumable)", flush=True)
            break
        batch = todo[b : b + args.batch_size]
        ids = [target.encode_prompt(p["prompt"]) for p in batch]
        width = max(map(len, ids))
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        t0 = time.time()
        with torch.no_grad():
            out = target.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                        do_sample=False, pad_token_id=pad, eos_token_id=eos)
        gen = out[:, width:].tolist()
        for p, x, g in zip(batch, ids, gen):
            answer, finish = [], "length"
            for t in g:
                answer.append(t)
                if t in target.eos_ids:
                    finish = "eos"
                    break
            records.append({"id": p["id"], "prompt_ids": x, "answer_ids": answer, "finish": finish})
            n_tokens += len(answer)
        write_corpus(args.out, header, records)
        dt = time.time() - t0
        new = sum(len(r["answer_ids"]) for r in records[-len(batch):])
        print(f"[{len(records)}/{len(prompts)}] batch {dt:.0f}s, {new / dt:.0f} tok/s, corpus {n_tokens} answer tokens, "
              f"{args.out.stat().st_size / 1e6:.2f} MB, elapsed {(time.time() - t_start) / 60:.1f} min", flush=True)
    print(f"done: {len(records)} records, {n_tokens} answer tokens", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
