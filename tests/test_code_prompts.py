"""Code prompts from the standard library's documented functions (offline/code_prompts.py)."""
from __future__ import annotations

import ast

from specdemo.offline import code_prompts, distill

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
