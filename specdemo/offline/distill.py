"""`python -m specdemo distill`: the target's own greedy answers to many prompts, the data its drafters learn from.

    python -m specdemo distill --model embedded --prompts sharegpt --first 8000 --later 2000 \\
        --out assets/corpus/sharegpt_distill.jsonl.gz

Batched greedy `generate` with the target's chat template (left padding, prompts sorted by length so a batch wastes
little padding).  Output: a gzip JSONL file, a header line then one record per prompt
    {"id", "prompt_ids", "answer_ids", "finish": "eos"|"length"}
as token ids only, so a million answer tokens stay a few MB.  Resumable and safe to kill: every finished batch is
appended to `<out>.journal.jsonl` and fsynced; a rerun reads the journal (a half-written last line is dropped),
skips the prompts it has, and the final file is written to a temporary name and renamed into place.

Prompt sources: `sharegpt` (the training split of ShareGPT, first user turns then later turns with their real
history, decontaminated; see sharegpt.py; `--heldout N` adds N held-out first turns, which the trainers keep for
evaluation), `stdlib` ("complete this function" requests built from the standard library's documented functions,
see code_prompts.py; `--first N` takes N of them, 0 all), `tasks` (summaries, grounded answers and translations
asked of ShareGPT's own text, task_prompts.py; `--first N` per kind), `project` (the project's own prompt set,
assets/corpus/prompts.jsonl) or a JSONL file of {"id", "prompt"} or {"id", "messages"} lines.

`--prompts stdlib-source` distils nothing: it writes S4C's extra training data, stdlib functions as requests answered
by their own code, until `--max-tokens` answer tokens (code_prompts.source_records; no header, no journal):

    python -m specdemo distill --prompts stdlib-source --max-tokens 90000 --out runs/s4c_stdlib.jsonl.gz
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch

from specdemo.kvcache import KVCache
from specdemo.offline import code_prompts, shards, sharegpt, task_prompts, train_loop
from specdemo.offline.build_datastore import load_tokenizer
from specdemo.offline.corpus import (
    FORMAT,
    PROMPTS_PATH,
    VERSION,
    journal_path,
    read_corpus,
)
from specdemo.offline.sharegpt import Decontaminator
from specdemo.target import load_target


def prompt_specs(source: str, first: int, later: int, heldout: int, every_later: bool = False) -> list[dict]:
    """{"id", "messages"} prompts of a source (see the module doc)."""
    if source in ("sharegpt", "tasks"):
        convs = sharegpt.conversations(decontaminate=sharegpt.Decontaminator.for_evaluation_sets())
        if source == "tasks":
            return task_prompts.task_prompts(convs, first)
        return (sharegpt.distill_prompts(convs, first, later, every_later=every_later)
                + sharegpt.distill_prompts(convs, heldout, 0, heldout=True))
    if source == "stdlib":
        return [{"id": p["id"], "messages": [{"role": "user", "content": p["prompt"]}]}
                for p in code_prompts.stdlib_prompts(first)]
    if source == "project":
        source = str(PROMPTS_PATH)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"prompt source '{source}' is neither sharegpt, stdlib, project nor an existing JSONL file")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
            out.append({"id": str(row.get("id", n)), "messages": messages})
    return out


def write_corpus(path: Path, header: dict, records: list[dict]) -> None:
    """The whole corpus, atomically (temporary file + rename); the journal is removed after."""
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(header) + "\n")
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    journal_path(path).unlink(missing_ok=True)


def _append(journal: Path, rows: list[dict]) -> None:
    with open(journal, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _cut_answer(ids: list[int], eos: set[int]) -> tuple[list[int], str]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1], "eos"
    return ids, "length"


def write_decontaminated(tokenizer, path: Path, header: dict, records: list[dict], log=print) -> list[dict]:
    """Write the records whose prompt and answer share no 10-word n-gram with HumanEval or Spec-Bench; returns them.

    Answers can repeat generic evaluation text (e.g. "0 1 2 3 4 5 6 7 8 9"): such records are dropped, not edited,
    and their ids join header["dropped"] so that a resumed run does not answer them again."""
    check = Decontaminator.for_evaluation_sets()
    kept = [r for r in records if all(check.clean(tokenizer.decode(r[k], skip_special_tokens=True))
                                      for k in ("prompt_ids", "answer_ids"))]
    if len(kept) < len(records):
        log(f"distill: dropped {len(records) - len(kept)} records that share a 10-gram with an evaluation set")
    header["dropped"] = sorted({r["id"] for r in records} - {r["id"] for r in kept} | set(header.get("dropped", [])))
    write_corpus(path, header, kept)
    return kept


@torch.no_grad()
def distill(target, specs: list[dict], out: Path, max_new_tokens: int = 256, max_prompt_tokens: int = 1024,
            batch_size: int = 32, minutes: float = 0.0, progress: bool = True, log=print, batch_tokens: int = 0,
            command: str = "") -> dict:
    """Answer every prompt of `specs` not yet in `out`; returns counts and throughput."""
    header = {"format": FORMAT, "version": VERSION, "model": target.name, "tokenizer": target.identity,
              "max_new_tokens": max_new_tokens, "decoding": "greedy, batched, left-padded, chat template"}
    if command:
        header["command"] = command
    old, records = read_corpus(out)
    if old and (old.get("tokenizer") != header["tokenizer"] or old.get("max_new_tokens") != max_new_tokens):
        raise ValueError(f"{out} was made with another tokenizer or --max-new-tokens; move it away to start over")
    done = {r["id"] for r in records} | set((old or {}).get("dropped", []))
    todo, skipped = _todo(target, specs, done, max_prompt_tokens)
    log(f"distill: {len(done)} prompts done, {len(todo)} to go ({skipped} longer than {max_prompt_tokens} tokens "
        f"skipped), batch {batch_size}, {target.describe()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    journal = journal_path(out)
    if not journal.exists() or journal.stat().st_size == 0:
        _append(journal, [header])
    t_start = time.time()
    n_new = _answer(target, todo, journal, records, max_new_tokens, batch_size, minutes, progress, log, batch_tokens)
    header["dropped"] = (old or {}).get("dropped", [])
    records = write_decontaminated(target.tokenizer, out, header, records, log)
    elapsed = time.time() - t_start
    stats = {"records": len(records), "answer_tokens": sum(len(r["answer_ids"]) for r in records),
             "new_answer_tokens": n_new, "seconds": round(elapsed, 1),
             "tokens_per_s": round(n_new / elapsed, 1) if elapsed else 0.0, "bytes": out.stat().st_size}
    log(f"distill: {stats['records']} records, {stats['answer_tokens']} answer tokens ({n_new} new at "
        f"{stats['tokens_per_s']} tok/s), {stats['bytes'] / 1e6:.2f} MB -> {out}")
    return stats


def _todo(target, specs: list[dict], done: set[str], max_prompt_tokens: int) -> tuple[list[tuple[str, list[int]]], int]:
    """(id, chat-templated prompt ids) of the prompts still to answer, longest first (a batch that does not fit fails
    at once, not hours in), and how many were skipped as longer than `max_prompt_tokens`."""
    todo = []
    skipped = 0
    for s in specs:
        if s["id"] in done:
            continue
        ids = target.encode_chat(s["messages"])
        if len(ids) > max_prompt_tokens:
            skipped += 1
            continue
        todo.append((s["id"], ids))
    todo.sort(key=lambda x: -len(x[1]))
    return todo, skipped


def _answer(target, todo: list[tuple[str, list[int]]], journal: Path, records: list[dict], max_new_tokens: int,
            batch_size: int, minutes: float, progress: bool, log, batch_tokens: int = 0) -> int:
    """Greedy answers of `todo` in left-padded batches, each batch appended to the journal (and to `records`) as soon
    as it is done; stops starting batches after `minutes` (0: no limit).  Returns the answer tokens generated.

    batch_tokens: at most this many prompt tokens per batch (0: `batch_size` rows whatever their length), so that a
    batch of 1,000-token prompts costs about what a batch of short ones does."""
    from tqdm import tqdm

    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(target.eos_ids)[0]
    t_start, n_new = time.time(), 0
    bar = tqdm(total=len(todo), unit="prompt", disable=not progress, file=sys.stderr)
    b = 0
    while b < len(todo):
        if minutes and time.time() - t_start > minutes * 60:
            log("distill: time budget reached; stopping (rerun to resume)")
            break
        # todo is longest first: its next prompt sets the batch's width, and `batch_tokens` caps rows x width
        size = min(batch_size, max(1, batch_tokens // len(todo[b][1]))) if batch_tokens else batch_size
        batch, b = todo[b: b + size], b + size
        width = max(len(ids) for _, ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in batch], device=target.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in batch], device=target.device)
        # a preallocated cache: transformers' default grows every layer by torch.cat each step, which copies the
        # whole batch's context and took half of a CPU step at 8 rows x 1,000 tokens
        cache = KVCache(capacity=width + max_new_tokens + 1)
        gen = target.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    past_key_values=cache, do_sample=False, temperature=None, top_p=None, top_k=None,
                                    pad_token_id=pad, eos_token_id=sorted(target.eos_ids))
        rows = []
        for (pid, ids), g in zip(batch, gen[:, width:].tolist()):
            answer, finish = _cut_answer(g, target.eos_ids)
            rows.append({"id": pid, "prompt_ids": ids, "answer_ids": answer, "finish": finish})
            n_new += len(answer)
        _append(journal, rows)
        records += rows
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{n_new / (time.time() - t_start):.0f}", tokens=n_new)
    bar.close()
    return n_new


def register(sub) -> None:
    p = sub.add_parser("distill", help="self-distil a corpus: the target's greedy answers to many prompts")
    p.add_argument("--model", default="embedded", help="'embedded', a hub id or a local path")
    p.add_argument("--prompts", default="sharegpt",
                   help="sharegpt | tasks | stdlib | project | PATH.jsonl[.gz]; stdlib-source: S4C's extra data "
                        "(module doc)")
    p.add_argument("--first", type=int, default=8000,
                   help="sharegpt: first user turns of training conversations; tasks: requests of each kind; "
                        "stdlib: functions (0 = all, for tasks too)")
    p.add_argument("--later", type=int, default=2000, help="sharegpt: later turns, with their real history")
    p.add_argument("--heldout", type=int, default=300, help="sharegpt: held-out first turns (for evaluation only)")
    p.add_argument("--every-later", action="store_true", help="sharegpt: every later turn, not one per conversation")
    p.add_argument("--out", type=Path,
                   help="a .jsonl.gz corpus, or a directory (ending in /) of numbered shards (shards.py)")
    p.add_argument("--export-prompts", type=Path, metavar="PATH.jsonl.gz",
                   help="answer nothing: write the prompts (less --skip's) as chat messages, for a machine without "
                        "the ShareGPT package to distil with --prompts PATH")
    p.add_argument("--shard-prompts", type=int, default=2000, help="directory --out: prompts per shard")
    p.add_argument("--shards", type=int, default=0, help="directory --out: answer only the first N shards (0 = all)")
    p.add_argument("--skip", nargs="*", default=[],
                   help="corpora (globs) whose ids a sharded corpus or --export-prompts leaves out")
    p.add_argument("--batch-tokens", type=int, default=0,
                   help="at most this many prompt tokens per batch (0 = --batch-size rows whatever their length)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--minutes", type=float, default=0, help="stop starting batches after this long (0 = no limit)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", help="float32 keeps the answers those of the CPU demo's model")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=90000,
                   help="stdlib-source: answer tokens to write (the functions' own code)")
    p.add_argument("--decontaminate-only", action="store_true",
                   help="only drop the records of OUT that share a 10-gram with an evaluation set")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.out is None and args.export_prompts is None:
        raise ValueError("distill needs --out (a corpus file or a shard directory) or --export-prompts")
    for name in ("first", "later", "heldout", "max_new_tokens", "max_prompt_tokens", "batch_size"):
        if getattr(args, name) < (0 if name in ("first", "later", "heldout") else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= {0 if name in ('first', 'later', 'heldout') else 1}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 answers match the CPU's as closely as a GPU allows
    torch.backends.cudnn.allow_tf32 = False
    if args.decontaminate_only:
        header, records = read_corpus(args.out)
        write_decontaminated(load_tokenizer(args.model), args.out, header, records)
        return 0
    if args.prompts == "stdlib-source":
        records = code_prompts.source_records(load_target(args.model, args.device, args.dtype), args.max_tokens)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        code_prompts.write_records(args.out, records)
        print(f"wrote {len(records)} functions, {sum(len(r['answer_ids']) for r in records)} answer tokens to "
              f"{args.out}")
        return 0
    specs = prompt_specs(args.prompts, args.first, args.later, args.heldout, args.every_later)
    if args.export_prompts:
        return export_prompts(specs, shards.skip_ids(args.skip), args.export_prompts)
    command = args.command_line
    if _is_directory(args.out):
        return distill_shards(args, specs, command)
    target = load_target(args.model, args.device, args.dtype)
    distill(target, specs, args.out, args.max_new_tokens, args.max_prompt_tokens, args.batch_size, args.minutes,
            batch_tokens=args.batch_tokens, command=command)
    return 0


def export_prompts(specs: list[dict], skip: set[str], path: Path) -> int:
    """Write `specs` less the ids in `skip` as {"id", "messages"} lines (gzip for a .gz path), which `--prompts PATH`
    reads back: the GPU machine has no ShareGPT package (120 MB), so its prompts travel as text."""
    kept = [{"id": s["id"], "messages": s["messages"]} for s in specs if s["id"] not in skip]
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if path.suffix == ".gz" else open)(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(s) + "\n" for s in kept)
    print(f"wrote {len(kept)} prompts ({len(specs) - len(kept)} skipped) to {path}")
    return 0


def _is_directory(out: Path) -> bool:
    return out.is_dir() or str(out).endswith("/") or not out.suffix


def distill_shards(args, specs: list[dict], command: str) -> int:
    """Sharded distillation (shards.py), on every process `accelerate launch` starts (one when run plainly)."""
    ddp = train_loop.DataParallel()
    target = load_target(args.model, ddp.device(args.device), args.dtype)
    manifest = shards.load_or_make_manifest(
        args.out, lambda: shards.make_manifest(target, specs, shards.skip_ids(args.skip), args.shard_prompts,
                                               args.max_prompt_tokens, command),
        ddp.is_main, ddp.state.wait_for_everyone)
    by_id = {s["id"]: s for s in specs}
    mine = shards.my_shards(manifest, ddp.rank, ddp.world, args.shards)
    for k in mine:
        path = shards.shard_path(args.out, k)
        if shards.finished(path, manifest["shards"][k]):
            continue
        print(f"distill: shard {k} of {len(manifest['shards'])} (process {ddp.rank})", flush=True)
        distill(target, [by_id[i] for i in manifest["shards"][k]], path, args.max_new_tokens, args.max_prompt_tokens,
                args.batch_size, args.minutes, progress=ddp.world == 1, batch_tokens=args.batch_tokens,
                command=manifest["command"])
    ddp.finish()
    return 0
