"""Bring your own datastore (local mode only): uploaded files, archives or a folder on this machine become a REST
datastore for the loaded model, which the page's REST races then use.

Uploads are untrusted: archives are unpacked with a cap on the bytes they expand to and no member outside the
unpack folder; binary files and empty ones are skipped and counted; the text read in all is capped.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from specdemo.drafters.rest.build import (
    TEXT_SUFFIXES,
    build_from_paths,
    collect_files,
)
from specdemo.target import Target, cache_root

MAX_TEXT_BYTES = 64 << 20  # text read from all inputs together (a 64 MB corpus builds in about a minute here)
MAX_FILES = 5_000
ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz")
SNIFF_BYTES = 8192


class UserStoreError(ValueError):
    """An input that cannot become a datastore; the message says why and what is allowed."""


@dataclass
class Corpus:
    files: list[Path] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> file names
    bytes: int = 0

    def skip(self, reason: str, name: str) -> None:
        self.skipped.setdefault(reason, []).append(name)

    def skipped_text(self) -> str:
        return "; ".join(f"{len(v)} {k} ({', '.join(v[:3])}{', …' if len(v) > 3 else ''})"
                         for k, v in self.skipped.items())


def is_text(path: Path) -> bool:
    """UTF-8 text without NUL bytes, judged from the first SNIFF_BYTES (a cut multi-byte character at the end of the
    sample is allowed)."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # only the sample's cut
    return True


def _unpack(archive: Path, into: Path) -> Path:
    """Unpack `archive` into a new folder under `into`, refusing members outside it, links, and more than
    MAX_TEXT_BYTES (as the archive itself declares them) before anything is written."""
    out = Path(tempfile.mkdtemp(prefix="unpacked-", dir=into))
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                members = [m for m in z.infolist() if not m.is_dir()]
                if sum(m.file_size for m in members) > MAX_TEXT_BYTES:
                    raise UserStoreError(f"{archive.name} expands to more than {MAX_TEXT_BYTES >> 20} MB.")
                for m in members:
                    if not (out / m.filename).resolve().is_relative_to(out.resolve()):
                        raise UserStoreError(f"{archive.name} has a member outside its folder: {m.filename}")
                z.extractall(out, members)
        else:
            with tarfile.open(archive) as t:
                members = [m for m in t.getmembers() if m.isfile()]
                if sum(m.size for m in members) > MAX_TEXT_BYTES:
                    raise UserStoreError(f"{archive.name} expands to more than {MAX_TEXT_BYTES >> 20} MB.")
                t.extractall(out, members, filter="data")  # the data filter refuses absolute paths and escapes
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise UserStoreError(f"{archive.name} is not a readable archive: {exc}") from None
    return out


def gather(inputs: list[str | Path], workdir: Path) -> Corpus:
    """The text files among `inputs` (uploaded files, archives, folders), within the caps."""
    corpus = Corpus()
    candidates: list[tuple[Path, bool]] = []  # (file, picked by the user itself: any name goes if it is text)
    for item in inputs:
        p = Path(item).expanduser()
        if not p.exists():
            raise UserStoreError(f"{p} does not exist: give files, .zip/.tar.gz archives or a folder of text.")
        if p.is_file() and p.name.lower().endswith(ARCHIVES):
            folder = _unpack(p, workdir)
            found = collect_files([folder])
            if not found:
                corpus.skip("empty archives", p.name)
            candidates += [(f, False) for f in found]
        elif p.is_dir():
            candidates += [(f, False) for f in collect_files([p])]
        else:
            candidates.append((p, True))
    for f, chosen in candidates:
        size = f.stat().st_size
        if len(corpus.files) >= MAX_FILES:
            corpus.skip(f"files over the cap of {MAX_FILES:,}", f.name)
        elif not chosen and not f.name.endswith(TEXT_SUFFIXES):
            corpus.skip("files of other kinds", f.name)
        elif size == 0:
            corpus.skip("empty files", f.name)
        elif not is_text(f):
            corpus.skip("binary files", f.name)
        elif corpus.bytes + size > MAX_TEXT_BYTES:
            corpus.skip(f"files past the {MAX_TEXT_BYTES >> 20} MB cap", f.name)
        else:
            corpus.files.append(f)
            corpus.bytes += size
    if not corpus.files:
        why = corpus.skipped_text() or "nothing was given"
        raise UserStoreError(f"No text to build a datastore from: {why}. Give UTF-8 text files (.txt, .md, .py, "
                             f".jsonl with text or conversations), .zip/.tar.gz archives of them, or a folder.")
    return corpus


def build_user_store(target: Target, inputs: list[str | Path], root: Path | None = None) -> tuple[Path, dict, Corpus]:
    """Build a REST datastore for `target` from `inputs` under `root` (default: the cache's user-stores folder), named
    by its content, so the same corpus is built once.  Returns (folder, manifest, corpus)."""
    root = Path(root or cache_root() / "user-stores")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=root))
    try:
        corpus = gather(inputs, work)
        digest = hashlib.sha256(target.name.encode())
        for f in corpus.files:
            digest.update(f.name.encode() + f.read_bytes())
        out = root / digest.hexdigest()[:16]
        if (out / "manifest.json").exists():  # this corpus was built for this model before
            manifest = json.loads((out / "manifest.json").read_text())
        else:
            manifest = build_from_paths(out, target.tokenizer, corpus.files, progress=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out, manifest, corpus
