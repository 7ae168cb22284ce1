"""ShareGPT reader, the shared held-out split, decontamination, and the distil CLI (resume after a kill)."""
from __future__ import annotations

import gzip
import json

import pytest

from specdemo.offline import distill, sharegpt
from specdemo.offline.corpus import distilled_corpora

RECORDS = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "How do I sort a list in Python?"},
                                     {"from": "gpt", "value": "Use sorted(xs)."},
                                     {"from": "human", "value": "And in reverse?"},
                                     {"from": "gpt", "value": "sorted(xs, reverse=True)."}]},
    {"id": "b_0", "conversations": [{"from": "gpt", "value": "I start, which a chat cannot."},
                                     {"from": "human", "value": "  "}, {"from": "system", "value": "x"},
                                     {"from": "human", "value": "Tell me about tides."},
                                     {"from": "human", "value": "Briefly."}, "not a turn",
                                     {"from": "gpt", "value": None}, {"from": "gpt", "value": "The moon pulls."}]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "how do i SORT a list in python?"}]},  # duplicate of a
    {"id": "d_0", "conversations": [{"from": "human", "value": "Как отсортировать список?"}]},  # not English
    {"id": "e_0", "conversations": []},
    {"id": "f_0", "conversations": [{"from": "human", "value": "alpha beta gamma delta epsilon zeta eta theta iota "
                                                             "kappa lambda, what follows?"}]},
]


def _truncated_file(tmp_path):
    text = json.dumps(RECORDS, ensure_ascii=False, indent=1)
    text = text[: len(text) - 40]  # cut inside the last record, as the packaged file is cut
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_reader_survives_truncation_and_odd_records(tmp_path):
    path = _truncated_file(tmp_path)
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    raw = list(sharegpt.iter_raw_records(path.read_text()))
    assert [r["id"] for r in raw] == ["a_0", "b_0", "c_0", "d_0", "e_0"]  # the cut record is dropped
    chat = sharegpt.normalise(RECORDS[1])
    assert chat == [{"role": "user", "content": "Tell me about tides.\n\nBriefly."},
                    {"role": "assistant", "content": "The moon pulls."}]
    assert sharegpt.normalise(RECORDS[4]) is None
    convs = sharegpt.conversations(path)
    assert [c.id for c in convs] == ["a_0", "b_0"]  # duplicate, non-English and empty ones dropped


def test_decontamination_drops_conversations_with_evaluation_ngrams(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(RECORDS[:1] + RECORDS[5:]), encoding="utf-8")
    check = sharegpt.Decontaminator(["Greek letters: alpha beta gamma delta epsilon zeta eta theta iota kappa."])
    assert not check.clean(RECORDS[5]["conversations"][0]["value"])
    assert check.clean("alpha beta gamma")  # shorter than ten words: no n-gram at all
    assert [c.id for c in sharegpt.conversations(path, decontaminate=check)] == ["a_0"]
    assert [c.id for c in sharegpt.conversations(path)] == ["a_0", "f_0"]


def test_heldout_split_is_fixed_and_keeps_conversation_parts_together():
    # fixed values: changing the split would silently mix held-out records into training
    assert [k for k in ("h72", "h146", "r0", "r1", "stub-012") if sharegpt.is_heldout(k)] == ["h72", "h146"]
    for base in ("QWJhYvA", "h72", "zz9"):
        sides = {sharegpt.is_heldout(f"{base}_{p}") for p in range(6)}
        assert len(sides) == 1 and sides == {sharegpt.is_heldout(base)}
        assert sharegpt.is_heldout_record(f"sg:{base}_3:2") == sharegpt.is_heldout(base)
        assert sharegpt.is_heldout_record(f"task:summarize:{base}_1:3") == sharegpt.is_heldout(base)
    share = sum(sharegpt.is_heldout(f"id{i}") for i in range(20000)) / 20000
    assert abs(share - sharegpt.HELDOUT_PERCENT / 100) < 0.005


def test_task_prompts_come_from_training_conversations_and_name_their_kind():
    from specdemo.offline import task_prompts

    german = "Ich weiß nicht, ob das für die Firma und den Kunden eine gute Idee ist."
    assert task_prompts.language_of(german) == "German"
    assert task_prompts.language_of("Pero en general, estaba satisfecho con el trabajo que había hecho.") == "Spanish"
    assert task_prompts.language_of("It is possible that the player is not configured on your system.") is None
    answer = " ".join(["The cache keeps every layer's keys and values in one tensor."] * 15)
    chats = {name: [{"role": "user", "content": "How does the cache store its entries for every layer?"},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Danke! Ich weiß nicht, ob das für die Firma und den Kunden eine gute "
                                                "Idee ist. Kannst du es noch einmal erklären?"}]
             for name in ("h72", "r0")}  # h72 is held out (the split test above), r0 is not
    convs = [sharegpt.Conversation(name, chat) for name, chat in chats.items()]
    specs = task_prompts.task_prompts(convs, 10)
    assert sorted(s["id"] for s in specs) == ["task:grounded:r0:1", "task:summarize:r0:1", "task:translate:r0:2:0"]
    assert not any(sharegpt.is_heldout_record(s["id"]) for s in specs)
    by_kind = {s["id"].split(":")[1]: s["messages"][0]["content"] for s in specs}
    assert by_kind["summarize"].endswith(answer) and "Question: How does the cache" in by_kind["grounded"]
    assert by_kind["translate"].startswith("Translate German to English: Ich weiß nicht")
    assert [s["id"] for s in task_prompts.task_prompts(convs, 10, heldout=True)][0].split(":")[2] == "h72"
    assert len(task_prompts.task_prompts(convs, 1)) == 3 == len(task_prompts.task_prompts(convs, 0))  # per kind; 0: all


def test_packaged_sharegpt_reads_record_by_record():
    convs = sharegpt.conversations()
    assert len(convs) > 15000  # the truncated package file still yields its ~17.7k conversations, deduplicated
    held = sum(c.heldout for c in convs) / len(convs)
    assert 0.02 < held < 0.04
    prompts = sharegpt.distill_prompts(convs, 50, 10)
    assert len(prompts) == 60 and not any(sharegpt.is_heldout_record(p["id"]) for p in prompts)
    assert all(p["messages"][-1]["role"] == "user" for p in prompts)
    assert all(len(p["messages"]) > 1 for p in prompts[50:])  # later turns keep their real history


def test_every_shipped_corpus_file_is_read_by_the_consumers():
    """A corpus committed under assets/corpus (a shard folder included) that `distilled_corpora` missed would escape
    the decontamination check below, REST's default store and the calibration's held-out check."""
    from specdemo import ASSETS

    shipped = set((ASSETS / "corpus").rglob("*.jsonl.gz"))
    assert shipped and shipped == set(distilled_corpora())


@pytest.mark.slow
def test_shipped_corpora_share_no_10gram_with_evaluation_sets():
    """Training prompts, answers and datastore documents of the embedded model vs HumanEval and Spec-Bench."""
    from transformers import AutoTokenizer

    from specdemo.target import embedded_dir

    tok = AutoTokenizer.from_pretrained(embedded_dir())
    check = sharegpt.Decontaminator.for_evaluation_sets()
    assert len(check.grams) > 50000  # both evaluation sets were read
    n = 0
    for path in distilled_corpora():  # the shipped corpora and every committed shard
        _, records = distill.read_corpus(path)
        for r in records:
            for key in ("prompt_ids", "answer_ids"):
                text = tok.decode(r[key], skip_special_tokens=True)
                assert check.clean(text), f"{path.name} {r['id']} {key} shares a 10-gram with an evaluation set"
            n += 1
    assert n > 7000


def test_the_calibrations_prompts_are_held_out_and_in_no_distilled_corpus():
    """The shipped calibration was fit on prompts no trainer saw and REST cannot retrieve: held-out conversations
    that no corpus or shard distilled (a refit on contaminated prompts would overrate the drafters)."""
    from specdemo.calibration import default_path

    prompts = json.loads(default_path("embedded").read_text())["prompts"]
    assert len(prompts) >= 16 and all(sharegpt.is_heldout_record(pid) for pid in prompts)
    distilled = {sharegpt.conversation_id(conv) for path in distilled_corpora() for r in distill.read_corpus(path)[1]
                 if (conv := sharegpt.source_conversation(r["id"])) is not None}
    assert not distilled & {sharegpt.conversation_id(pid.split(":")[1]) for pid in prompts}


def test_distill_resumes_after_a_kill_and_writes_atomically(tiny_llama, tmp_path):
    t = tiny_llama
    specs = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"question number {i} " * (1 + i % 3)}]}
             for i in range(7)]
    out = tmp_path / "corpus.jsonl.gz"
    full = distill.distill(t, specs, tmp_path / "ref.jsonl.gz", max_new_tokens=6, batch_size=3, progress=False,
                           log=lambda m: None)
    assert full["records"] == 7 and not distill.journal_path(tmp_path / "ref.jsonl.gz").exists()
    _, ref = distill.read_corpus(tmp_path / "ref.jsonl.gz")
    # a run killed mid-way: the journal holds the header, two finished records and half a line
    header = {"format": distill.FORMAT, "version": distill.VERSION, "model": t.name, "tokenizer": t.identity,
              "max_new_tokens": 6}
    journal = distill.journal_path(out)
    journal.write_text("\n".join(json.dumps(x) for x in [header] + ref[:2]) + '\n{"id": "p5", "prompt_')
    stats = distill.distill(t, specs, out, max_new_tokens=6, batch_size=3, progress=False, log=lambda m: None)
    assert stats["records"] == 7 and stats["new_answer_tokens"] == sum(len(r["answer_ids"]) for r in ref[2:])
    _, got = distill.read_corpus(out)
    assert sorted(r["id"] for r in got) == [f"p{i}" for i in range(7)]
    assert {r["id"]: r["answer_ids"] for r in got} == {r["id"]: r["answer_ids"] for r in ref}
    assert not journal.exists() and not list(tmp_path.glob("*.tmp"))
    with gzip.open(out, "rt") as f:
        assert json.loads(f.readline())["format"] == distill.FORMAT
    # another tokenizer or length is refused, nothing lost
    with pytest.raises(ValueError, match="another tokenizer or --max-new-tokens"):
        distill.distill(t, specs, out, max_new_tokens=7, progress=False, log=lambda m: None)
    assert distill.read_corpus(out)[1] == got


def test_tune_prompts_are_the_turns_after_the_calibrations(tmp_path, monkeypatch):
    """`calibrate --tune-prompts`: the turns that follow the calibration's own, in its order, as {"id", "prompt"}."""
    from specdemo.offline import calibrate

    turns = [(f"sg:c{i}:0", f"question {i}", [1, 2, i]) for i in range(10)]
    monkeypatch.setattr(calibrate, "calibration_turns", lambda n, max_tokens, target: turns[:n])
    path = tmp_path / "tune" / "p.jsonl"
    assert calibrate.write_tune_prompts(None, path, 3, 4, 1024) == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"id": f"sg:c{i}:0", "prompt": f"question {i}"} for i in (4, 5, 6)]
