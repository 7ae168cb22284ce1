"""Bring your own datastore: uploads checked and capped, a small corpus built for the embedded model and raced."""
from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

import specdemo.app.user_store as user_store
from specdemo.app.user_store import UserStoreError, build_user_store, gather, is_text


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_text_is_kept_and_junk_is_skipped_with_reasons(tmp_path):
    good = _write(tmp_path / "notes", "plain text without a suffix, picked by the user\n".encode())
    code = _write(tmp_path / "a.py", b"print('hi')\n")
    binary = _write(tmp_path / "image.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    empty = _write(tmp_path / "empty.txt", b"")
    corpus = gather([good, code, binary, empty], tmp_path)
    assert corpus.files == [good, code]
    assert set(corpus.skipped) == {"binary files", "empty files"} and "image.png" in corpus.skipped_text()
    assert is_text(_write(tmp_path / "cut.txt", "é".encode() * 4096 + b"\xc3"))  # a character cut by the sample
    assert not is_text(_write(tmp_path / "latin1.txt", b"caf\xe9 " * 10))


def test_archives_are_unpacked_within_their_folder_and_caps(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("docs/a.md", "# Title\nSome text.\n")
        z.writestr("docs/b.bin", b"\0\1\2")
        z.writestr("docs/c.md", b"\0binary pretending")
    zip_path = _write(tmp_path / "docs.zip", buf.getvalue())
    corpus = gather([zip_path], tmp_path)
    assert [f.name for f in corpus.files] == ["a.md"] and "binary files" in corpus.skipped  # c.md is binary

    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../escape.txt", "x")
    with pytest.raises(UserStoreError, match="outside its folder"):
        gather([_write(tmp_path / "evil.zip", evil.getvalue())], tmp_path)

    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w:gz") as t:
        data = b"word " * 1000
        info = tarfile.TarInfo("big.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    tar_path = _write(tmp_path / "big.tar.gz", tar_buf.getvalue())
    monkeypatch.setattr(user_store, "MAX_TEXT_BYTES", 1000)
    with pytest.raises(UserStoreError, match="expands to more than"):
        gather([tar_path], tmp_path)


@pytest.mark.parametrize("make, expect", [
    (lambda p: [_write(p / "x.bin", b"\0\0\0")], "No text to build a datastore from: 1 binary files"),
    (lambda p: [_write(p / "e.zip", _empty_zip())], "1 empty archives"),
    (lambda p: [_write(p / "broken.zip", b"PK not really")], "not a readable archive"),
    (lambda p: [p / "missing"], "does not exist"),
    (lambda p: [], "nothing was given"),
])
def test_junk_gets_a_message(tmp_path, make, expect):
    with pytest.raises(UserStoreError, match=expect):
        gather(make(tmp_path), tmp_path)


def _empty_zip() -> bytes:
    buf = io.BytesIO()
    zipfile.ZipFile(buf, "w").close()
    return buf.getvalue()


def test_a_built_store_is_raced_by_rest(embedded, tmp_path):
    """The corpus is the model's own answer, so REST must retrieve from it: drafts sourced "datastore" get accepted,
    and the output stays identical to AR."""
    from specdemo.app.request import race_request
    from specdemo.app.models import MODELS
    from specdemo.app.racing import run_race

    MODELS.put("embedded", embedded)
    prompt = "Name three uses of copper."
    first = list(run_race(race_request(prompt, "pld", max_new_tokens=40)))[-1]
    corpus = _write(tmp_path / "answer.txt", first.texts["ar"].encode())
    out, manifest, files = build_user_store(embedded, [corpus], root=tmp_path / "stores")
    assert manifest["tokens"] > 20 and files.files == [corpus]
    again, _, _ = build_user_store(embedded, [corpus], root=tmp_path / "stores")
    assert again == out  # the same corpus is built once
    rec = list(run_race(race_request(prompt, "rest", max_new_tokens=40, options={"datastore": str(out)})))[-1]
    assert rec.status == "done" and rec.summaries["rest"].identical
    assert any(src == "datastore" for ev in rec.runs["rest"].events for src, fd in zip(ev.sources, ev.from_draft)
               if fd)


def test_the_page_builds_a_store_and_its_rest_races_use_it(embedded, tmp_path, monkeypatch):
    import specdemo.app.page.handlers as page
    from specdemo.app.page.handlers import RACE_OUTPUTS, on_build_store, on_race, on_reset_store
    from specdemo.drafters import all_knobs

    monkeypatch.setattr(user_store, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(page, "TEXT_EVERY", 3600.0)
    junk, state = on_build_store("embedded", [str(_write(tmp_path / "x.bin", b"\0\0"))], "",
                                 progress=lambda *a, **k: None)
    assert "No text to build a datastore from" in junk and "sd-msg-error" in junk
    text = _write(tmp_path / "t.md", b"Copper conducts electricity and heat; it is used in wires and pipes.\n" * 20)
    ok, state = on_build_store("embedded", [str(text)], "", progress=lambda *a, **k: None)
    assert "Built a datastore of" in ok and "REST races on this model now retrieve from it" in ok
    knobs = tuple(k.value for k in all_knobs())

    def race(store):  # the session's datastore travels in the page's state
        outs = list(on_race(None, "rest", "embedded", "fp32", "Copper is", 8, 0.0, 1.0, 0, 0, store, *knobs))
        return dict(zip(RACE_OUTPUTS, outs[-1]))["record_state"]

    rec = race(state)
    assert rec.request.options["rest"]["datastore"].startswith(str(tmp_path / "user-stores"))
    assert rec.summaries["rest"].identical
    message, state = on_reset_store()
    assert "default datastore again" in message and state is None
    assert "datastore" not in race(state).request.options["rest"]
