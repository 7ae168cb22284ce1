"""Code prompts from the standard library's documented functions (offline/code_prompts.py)."""
from __future__ import annotations

import ast

from specdemo import cli
from specdemo.offline import code_prompts, corpus, distill

SOURCE = '''
def documented(a, b=2, *args, key: str = "x") -> int:
    """Add a and b, then repeat the sum for every extra argument given.

    Returns the total as an integer.
    """
    return a + b

def short(x):
    """Too short."""
    return x

def undocumented(x):
    return x

def __dunder__(x):
    """A documented dunder function that is not a request anyone writes."""

class Klass:
    def method(self):
        """A documented method: only top-level functions become prompts."""

async def fetch(url):
    """Fetch the resource at url and return its body as bytes, following redirects."""
'''


def test_stubs_show_signature_and_docstring_but_never_the_body():
    stubs = dict(code_prompts.module_stubs(SOURCE))
    assert list(stubs) == ["documented", "fetch"]
    doc = stubs["documented"]
    assert doc.startswith("def documented(a, b=2, *args, key: str='x') -> int:\n    \"\"\"Add a and b")
    assert "return a + b" not in doc and doc.endswith('    """\n')
    assert "    Returns the total as an integer." in doc  # docstring lines keep the function's indentation
    assert stubs["fetch"].startswith("async def fetch(url):")
    for stub in stubs.values():  # a stub is valid Python: a function whose body is its docstring
        fn = ast.parse(stub).body[0]
        assert len(fn.body) == 1 and ast.get_docstring(fn)
    assert list(code_prompts.module_stubs("def broken(:\n")) == []  # unparsable files are skipped


class _Reject:
    """A decontaminator stand-in that rejects prompts mentioning `word`."""

    def __init__(self, word: str):
        self.word = word

    def clean(self, text: str) -> bool:
        return self.word not in text


def test_stdlib_prompts_are_fixed_unique_and_decontaminated():
    keep_all = _Reject("\0")
    everything = code_prompts.stdlib_prompts(decontaminate=keep_all)
    assert len(everything) > 1000
    assert len({p["id"] for p in everything}) == len({p["prompt"] for p in everything}) == len(everything)
    assert code_prompts.stdlib_prompts(50, decontaminate=keep_all) == everything[:50]  # a fixed order
    assert all(p["id"].startswith("stdlib:") and p["prompt"].startswith("Complete this Python function:")
               for p in everything)
    assert not any(".test." in p["id"] or p["id"].startswith("stdlib:test.") for p in everything)
    dropped = code_prompts.stdlib_prompts(decontaminate=_Reject("path"))
    assert dropped and not any("path" in p["prompt"] for p in dropped) and len(dropped) < len(everything)


def test_distill_reads_the_stdlib_source():
    specs = distill.prompt_specs("stdlib", 5, 0, 0)
    assert len(specs) == 5 and all(s["messages"][0]["role"] == "user" for s in specs)
    assert [s["id"] for s in specs] == [p["id"] for p in code_prompts.stdlib_prompts(5)]


LIBRARY = '''
def documented(values, key=None):
    """Return the values sorted by key, dropping the ones that compare equal to an earlier one."""
    seen = []
    for v in sorted(values, key=key):
        if not seen or seen[-1] != v:
            seen.append(v)
    return seen

def tiny(x):
    return x

class Klass:
    def method(self, a, b, c):
        """A method: only top-level functions are taken, whatever their length; this one is long enough."""
        return a + b + c
'''


def test_source_records_pair_a_head_with_the_whole_function(tmp_path, tiny_llama):
    """S4C's extra data (`distill --prompts stdlib-source`): the request shows the head (signature and docstring), the
    answer is the library's own code in a python block, then EOS; tests and bundled packages are skipped."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "mod.py").write_text(LIBRARY)
    (tmp_path / "pkg" / "sub.py").write_text(LIBRARY.replace("documented", "other"))
    (tmp_path / "tests" / "test_mod.py").write_text(LIBRARY.replace("documented", "hidden"))
    items = list(code_prompts.source_functions(tmp_path))
    assert [i for i, _, _ in items] == ["mod.py:documented", "sub.py:other"]
    _, head, body = items[0]
    assert head.endswith('compare equal to an earlier one."""') and "seen = []" not in head
    assert body.startswith(head) and body.endswith("return seen")
    recs = code_prompts.source_records(tiny_llama, 10 ** 6, root=tmp_path)
    assert {r["id"] for r in recs} == {"mod.py:documented", "sub.py:other"}
    assert recs == code_prompts.source_records(tiny_llama, 10 ** 6, root=tmp_path)  # a seeded order
    r = next(r for r in recs if r["id"] == "mod.py:documented")
    tok = tiny_llama.tokenizer
    assert r["prompt_ids"] == tiny_llama.encode_prompt(f"Complete this Python function:\n```python\n{head}\n```")
    assert r["answer_ids"][-1] == tok.eos_token_id and "return seen" in tok.decode(r["answer_ids"])
    assert len(code_prompts.source_records(tiny_llama, 1, root=tmp_path)) == 1  # stops once the tokens are reached
    path = tmp_path / "extra.jsonl.gz"
    code_prompts.write_records(path, recs)
    pairs = lambda rs: [(x["id"], x["prompt_ids"], x["answer_ids"]) for x in rs]  # noqa: E731
    assert pairs(corpus.read_records([path])) == pairs(recs)


def test_distill_stdlib_source_command(tmp_path, tiny_llama):
    out = tmp_path / "stdlib.jsonl.gz"
    assert cli.main(["distill", "--prompts", "stdlib-source", "--model", str(tiny_llama.model.name_or_path),
                     "--max-tokens", "300", "--out", str(out)]) == 0
    recs = corpus.read_records([out])
    assert recs and sum(len(r["answer_ids"]) for r in recs) >= 300 and all(":" in r["id"] for r in recs)
