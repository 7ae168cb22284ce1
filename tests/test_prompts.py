"""Prompt sets and the per-group bench summary: the Spec-Bench dev split, its stratified sample, and the per-group
figures computed from synthetic runs (no model is loaded here)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdemo import bench
from specdemo.prompts import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_GROUPS,
    jsonl_prompts,
    load_prompts,
    stratified,
)

ROOT = Path(__file__).resolve().parent.parent


def test_spec_bench_loads_with_categories_and_groups():
    prompts = load_prompts("spec_bench")
    assert len(prompts) == 416
    assert all({"id", "prompt", "category", "group"} <= set(p) for p in prompts)
    assert prompts[0]["id"] == "writing-81" and prompts[0]["group"] == "mt_bench"
    assert len({p["id"] for p in prompts}) == 416
    assert set(p["group"] for p in prompts) == set(SPEC_BENCH_GROUPS)
    assert {p["category"] for p in prompts if p["group"] == "mt_bench"} == set(MT_BENCH_CATEGORIES)
    assert all(p["group"] == p["category"] for p in prompts if p["group"] != "mt_bench")
    assert all(isinstance(p["prompt"], str) and p["prompt"].strip() for p in prompts)


def test_stratified_takes_the_same_number_from_every_group_deterministically():
    prompts = load_prompts("spec_bench")
    picked = stratified(prompts, 12)
    assert len(picked) == 72
    assert Counter(p["group"] for p in picked) == {g: 12 for g in SPEC_BENCH_GROUPS}
    assert [p["id"] for p in stratified(load_prompts("spec_bench"), 12)] == [p["id"] for p in picked]
    assert {p["category"] for p in picked if p["group"] == "mt_bench"} == set(MT_BENCH_CATEGORIES)
    order = {p["id"]: i for i, p in enumerate(prompts)}
    assert [order[p["id"]] for p in picked] == sorted(order[p["id"]] for p in picked), "file order is kept"
    assert len({p["id"] for p in picked}) == 72
    # the picks spread over a group instead of taking its head
    translation = [order[p["id"]] for p in picked if p["group"] == "translation"]
    first = [i for i, p in enumerate(prompts) if p["group"] == "translation"]
    assert translation[0] < first[len(first) // 4] and translation[-1] > first[3 * len(first) // 4]


def test_stratified_refuses_ungrouped_prompts_and_groups_that_are_too_small():
    with pytest.raises(ValueError, match="group"):
        stratified(load_prompts("chat"), 2)
    with pytest.raises(ValueError, match="mt_bench"):
        stratified(load_prompts("spec_bench"), 53)  # mt_bench holds 52


def test_jsonl_prompts_keep_both_formats(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt": "hello"}) + "\n"
                    + json.dumps({"question_id": 7, "category": "roleplay", "turns": ["hi", "again"]}) + "\n"
                    + json.dumps({"id": "y", "prompt": "bye", "group": "custom"}) + "\n")
    assert jsonl_prompts(path) == [{"id": "x", "prompt": "hello"},
                                   {"id": "roleplay-7", "prompt": "hi", "category": "roleplay", "group": "mt_bench"},
                                   {"id": "y", "prompt": "bye", "group": "custom"}]


def _run(pid: str, group: str | None, n: int, wall: float, accept: list[int] | None, tokens: list[int] | None = None):
    return {"id": pid, "group": group, "tokens": tokens or list(range(n)), "wall_time": wall,
            "accept_lengths": accept if accept is not None else [], "draft_s": [0.001] * len(accept or []),
            "verify_s": [0.01] * len(accept or [])}


def _synthetic_result() -> dict:
    """pld doubles speed on translation and loses 20% on qa; hf never has a tau and misses one prompt's tokens."""
    runs = {
        "ar": [_run("t1", "translation", 10, 1.0, [1] * 10), _run("t2", "translation", 10, 1.0, [1] * 10),
               _run("q1", "qa", 20, 2.0, [1] * 20)],
        "pld": [_run("t1", "translation", 10, 0.5, [2] * 5), _run("t2", "translation", 10, 0.5, [2] * 5),
                _run("q1", "qa", 20, 2.5, [1] * 20)],
        "hf": [_run("t1", "translation", 10, 1.0, None), _run("t2", "translation", 10, 1.0, None, [9] * 10),
               _run("q1", "qa", 20, 1.0, None)],
    }
    target = SimpleNamespace(device=torch.device("cpu"), packed_linears=False, name="fake", dtype=torch.float32,
                             artifacts={})
    runs["ar"][1]["margins"] = [0.25 + i for i in range(10)]  # AR's top-2 gap at each of t2's tokens
    return bench.summarise(target, ["ar", "pld", "hf"], runs, 32, bench.SamplingConfig())


def test_per_group_summary_uses_the_overall_formulas_on_each_group():
    res = _synthetic_result()
    assert list(res["groups"]) == ["translation", "qa"]
    tr, qa = res["groups"]["translation"], res["groups"]["qa"]
    assert tr["ar"] == {"tokens_per_s": 10.0, "speedup": 1.0, "tau": 1.0, "identical": 1.0, "prompts": 2}
    assert tr["pld"] == {"tokens_per_s": 20.0, "speedup": 2.0, "tau": 2.0, "identical": 1.0, "prompts": 2}
    assert qa["pld"]["speedup"] == pytest.approx(0.8) and qa["pld"]["tau"] == 1.0 and qa["pld"]["prompts"] == 1
    assert tr["hf"]["tau"] is None and tr["hf"]["identical"] == 0.5 and qa["hf"]["speedup"] == pytest.approx(2.0)
    overall = res["methods"]["pld"]
    assert overall["tokens_per_s"] == pytest.approx(40 / 3.5) and overall["speedup"] == pytest.approx(40 / 3.5 / 10)
    assert overall["tau"] == pytest.approx(40 / 30)
    assert "prompts" not in overall
    assert [p["group"] for p in overall["per_prompt"]] == ["translation", "translation", "qa"]


def test_format_table_adds_a_per_group_table_after_the_unchanged_overall_one():
    res = _synthetic_result()
    text = bench.format_table(res)
    overall_only = bench.format_table({**res, "groups": {}})
    assert text.startswith(overall_only + "\n") and "per group" not in overall_only
    rows = {line.split()[0]: line.split()[1:] for line in text[len(overall_only):].splitlines()[3:]}
    assert rows["translation"] == ["1.00x/1.00", "2.00x/2.00", "1.00x/-"]
    assert rows["qa"] == ["1.00x/1.00", "0.80x/1.00", "2.00x/-"]
    assert rows["overall"] == ["1.00x/1.00", "1.14x/1.33", "1.33x/-"]


def test_decoding_alone_leaves_out_the_prompts_prefill():
    """Every mode prefills a prompt with the same forward: the speedup of the decoding alone is tokens/s over the time
    after it, against AR's; the table says what share of AR's time the prefill took.  Runs that do not report a
    prefill (transformers', llama.cpp's) get none."""
    res = _synthetic_result()
    runs = {m: [dict(p, tokens=list(range(p["new_tokens"]))) for p in r["per_prompt"]]
            for m, r in res["methods"].items()}
    for m in ("ar", "pld"):
        for r in runs[m]:
            r["prefill_s"] = 0.25 * r["new_tokens"] / 10  # 0.25 s for each translation prompt, 0.5 s for qa's
    assert bench.decode_speedup(runs["hf"], runs["ar"]) is None
    ar_decode, pld_decode = 40 / (4.0 - 1.0), 40 / (3.5 - 1.0)  # AR 4.0 s, pld 3.5 s in all, 1.0 s of it prefill
    assert bench.decode_speedup(runs["pld"], runs["ar"]) == pytest.approx(pld_decode / ar_decode)
    for m in ("ar", "pld"):
        for p, r in zip(res["methods"][m]["per_prompt"], runs[m]):
            p["prefill_s"] = r["prefill_s"]
    res["methods"]["pld"]["decode_speedup"] = bench.decode_speedup(runs["pld"], runs["ar"])
    assert bench.prefill_line(res) == (f"prefill: 25% of AR's time (one forward over the prompt, the same in every "
                                       f"mode); speedup of the decoding alone: pld {pld_decode / ar_decode:.2f}x")
    assert bench.prefill_line(_synthetic_result()) is None  # no prefill recorded: no line


def test_format_table_header_names_the_weights_a_run_decoded_with():
    """The header names the CPU linears' precision, or the model's dtype where the linears are the model's own (a
    bf16 run on a GPU is not called fp32)."""
    res = _synthetic_result()
    header = lambda **kw: bench.format_table({**res, **kw, "groups": {}}).splitlines()[0]  # noqa: E731
    assert "(fp32)" in header(dtype="float32", precision="fp32")
    assert "(bfloat16)" in header(dtype="bfloat16", precision="fp32")
    assert "(int4)" in header(dtype="float32", precision="int4")


def test_bench_lists_where_a_method_left_ars_tokens_and_how_near_a_tie_it_was():
    res = _synthetic_result()  # hf's tokens on t2 differ from AR's from the first token on
    hf = res["methods"]["hf"]["per_prompt"]
    assert [p["first_difference"] for p in hf] == [None, 0, None]
    assert hf[1]["tie_gap"] == 0.25  # AR's gap at t2's token 0
    assert "hf differs from ar on 1 of 3 prompts: t2 at token 0 (top-2 gap 0.25)\n" in bench.format_table(res) + "\n"
    assert "pld differs" not in bench.format_table(res)


def test_bench_table_script_renders_the_per_group_table(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_synthetic_result()))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_table.py"), str(path)], capture_output=True,
                         text=True, check=True).stdout
    assert "| group | prompts | ar | pld | hf |" in out
    assert "| translation | 2 | 1.00× / 1.00 | 2.00× / 2.00 | 1.00× / – |" in out
    assert "| overall | 3 |" in out


def _bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_per_group_on_a_set_without_groups_fails_before_loading_the_model():
    args = _bench_args("--prompts", "chat", "--per-group", "2")
    with pytest.raises(ValueError, match="--per-group needs a prompt set .* groups .*spec_bench"):
        args.func(args)
    with pytest.raises(ValueError, match="do not combine"):
        bench.select_prompts(load_prompts("spec_bench"), "spec_bench", 5, 2)


def test_select_prompts_limit_and_per_group():
    prompts = load_prompts("spec_bench")
    assert [p["id"] for p in bench.select_prompts(prompts, "spec_bench", None, 0)] == [p["id"] for p in prompts[:10]]
    assert len(bench.select_prompts(prompts, "spec_bench", 3, 0)) == 3
    assert len(bench.select_prompts(prompts, "spec_bench", None, 2)) == 12
    with pytest.raises(ValueError, match="--limit must be positive"):
        bench.select_prompts(prompts, "spec_bench", 0, 0)


def test_spec_bench_splits_once_into_tune_and_check_halves():
    """Choices are measured on one half and tables published from the other: the halves are disjoint, cover the
    set, hold every group (enough for the bench's --per-group 12) and depend on the prompt id alone."""
    from collections import Counter

    from specdemo.bench import select_prompts
    from specdemo.prompts import load_prompts, split_of

    every = load_prompts("spec_bench")
    tune, check = load_prompts("spec_bench:tune"), load_prompts("spec_bench:check")
    ids = lambda ps: [p["id"] for p in ps]  # noqa: E731
    assert not set(ids(tune)) & set(ids(check)) and sorted(ids(tune) + ids(check)) == sorted(ids(every))
    groups = {p["group"] for p in every}
    for half in (tune, check):
        counts = Counter(p["group"] for p in half)
        assert set(counts) == groups and min(counts.values()) >= 12
        assert len(select_prompts(half, "spec_bench:tune", None, 12)) == 12 * len(groups)
    assert all(split_of(p["id"]) == "tune" for p in tune) and split_of("x") == split_of("x")
    assert 0.4 < len(tune) / len(every) < 0.6


def test_transformers_reference_rows_run_and_agree(tiny_llama):
    """`hf`, `hf-pld` and `hf-static` are transformers' own generate on the same prompt: the static cache and prompt
    lookup change how it decodes, not what (greedy)."""
    ids = tiny_llama.encode_prompt("The quick brown fox")
    runs = {m: bench.run_one(tiny_llama, m, ids, 12, bench.SamplingConfig()) for m in bench.HF_METHODS}
    assert len(runs["hf"]["tokens"]) == 12
    assert runs["hf-static"]["tokens"] == runs["hf"]["tokens"] == runs["hf-pld"]["tokens"]
