"""The documents that describe the code stay true to it: docs/api.md is what the endpoints and the registry say, and
README stays a page for users."""
from __future__ import annotations

from pathlib import Path

from specdemo.app.api import api_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_the_api_doc_is_generated_from_the_code():
    assert (ROOT / "docs" / "api.md").read_text() == api_markdown(), \
        "docs/api.md is stale: regenerate it with `python -m specdemo.app.api`"


def test_the_api_doc_names_every_method_and_option():
    from specdemo.drafters import REGISTRY, options

    doc = api_markdown()
    for m in REGISTRY:
        assert f"`{m.name}` ({m.label})" in doc
        assert all(f"`{o.name}`" in doc for o in options(m.name))


def test_readme_is_a_page_for_users():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; method internals and records belong in docs/"
