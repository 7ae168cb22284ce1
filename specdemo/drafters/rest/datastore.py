"""REST datastore: token array + suffix array on disk (memory-mapped), its loader and retrieval.

Format (a folder; version 1):
    tokens.npy     u16 (len(tokenizer) <= 65535) or u32: [SEP] doc0 [SEP] doc1 [SEP] ... [SEP]
                   SEP = the dtype's largest value (65535 / 2**32-1): never a real token id, so a query can never match
                   across a document boundary and continuations stop at it.
    sa.npy         i32 (i64 past 2**31 tokens): the suffix array of the token array read BACKWARDS, stored as forward
                   end offsets.  Entry e stands for the prefix tokens[:e] read from tokens[e-1] towards the start; the
                   entries are sorted by that reversed string.  So all the places where the context's last m tokens
                   occur form one contiguous range, and the range for m+1 tokens lies inside the range for m: the
                   longest suffix match of a context is found by narrowing one range, one token at a time (16 binary
                   searches, each inside the last).  The continuation of entry e is tokens[e:e+10].  Only entries with
                   a real token on both sides (tokens[e-1], tokens[e] != SEP) are stored.
    manifest.json  format, version, tokenizer identity (specdemo.target.tokenizer_identity), vocab size, dtype,
                   separator, documents, tokens, build time, sources, and size + sha256 of both arrays.

Built by build.py beside this file, from the CLI (`python -m specdemo datastore build --model embedded --input
PATHS... [--out DIR]`, specdemo/offline/build_datastore.py) or the page's "Your datastore"; the default DIR is the
model's default datastore, which the REST drafter picks up by itself.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from specdemo.target import cache_root

FORMAT = "specdemo-datastore"
VERSION = 1


class DatastoreError(RuntimeError):
    """A datastore cannot be built or used; the message says what to do."""


def separator_for(dtype: np.dtype) -> int:
    return int(np.iinfo(dtype).max)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def build_command(model: str, inputs: str = "PATHS...", out: str | None = None) -> str:
    cmd = f"python -m specdemo datastore build --model {model} --input {inputs}"
    return cmd + (f" --out {out}" if out else "")


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    """The hex sha256 of a file, read in chunks (the manifest records one per array)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# Loading and retrieval
# ---------------------------------------------------------------------------------------------------------------------
class Datastore:
    """A memory-mapped datastore.  `match` finds the longest suffix match, `continuations` reads what followed.

    Opening refuses, with the command that rebuilds it, a store made for another tokenizer, one whose files differ
    from its manifest (truncated, corrupt: checked by size, and by sha256 when `verify`) and one holding token ids
    outside the model's vocabulary: any of these would draft garbage instead of failing.
    """

    def __init__(self, path: str | Path, target=None, identity: str | None = None, vocab_size: int | None = None,
                 verify: bool = True, model_name: str | None = None):
        self.path = Path(path)
        model_name = model_name or (target.name if target is not None else "MODEL")
        self._rebuild = build_command(model_name, out=str(self.path))
        self.manifest = m = self._read_manifest()
        if target is not None:
            identity = identity or target.identity
            vocab_size = vocab_size or len(target.tokenizer)
        if identity is not None and m["tokenizer"] != identity:
            raise DatastoreError(
                f"The datastore {self.path} was built for another tokenizer ({m['tokenizer']}, "
                f"{m.get('tokenizer_name') or 'unknown model'}) than the model's ({identity}): its token ids would "
                f"mean different words. Build one for this model with `{self._rebuild}`.")
        self._check_files(verify)
        self.dtype = np.dtype(m["dtype"])
        self.sep = int(m["separator"])
        self.tokens, self.sa = self._load_arrays()
        self.vocab = self._checked_vocab(vocab_size or m["vocab_size"])
        self._first = self._first_token_ranges()
        self._tmv = memoryview(self.tokens) if self.tokens.flags.c_contiguous else None
        self._smv = memoryview(self.sa)

    def _read_manifest(self) -> dict:
        mpath = self.path / "manifest.json"
        if not mpath.exists():
            raise DatastoreError(f"No datastore at {self.path} (manifest.json missing). Build one with "
                                 f"`{self._rebuild}`.")
        try:
            m = json.loads(mpath.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DatastoreError(f"{mpath} is corrupt ({exc}). Rebuild the datastore with `{self._rebuild}`.") from exc
        if m.get("format") != FORMAT or m.get("version") != VERSION:
            raise DatastoreError(f"{self.path} is not a {FORMAT} v{VERSION} datastore (found {m.get('format')} "
                                 f"v{m.get('version')}). Rebuild it with `{self._rebuild}`.")
        return m

    def _check_files(self, verify: bool) -> None:
        """Every array file the manifest lists exists with its recorded size (and sha256 when `verify`)."""
        for name, info in self.manifest["files"].items():
            f = self.path / name
            if not f.exists():
                raise DatastoreError(f"{f} is missing. Rebuild the datastore with `{self._rebuild}`.")
            size = f.stat().st_size
            if size != info["bytes"]:
                raise DatastoreError(f"{f} is truncated or corrupt ({size} bytes, the manifest says {info['bytes']}). "
                                     f"Rebuild the datastore with `{self._rebuild}`.")
            if verify and file_sha256(f) != info["sha256"]:
                raise DatastoreError(f"{f} is corrupt (its sha256 differs from the manifest's). Rebuild the datastore "
                                     f"with `{self._rebuild}`.")

    def _load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, suffix array), memory-mapped, as plain ndarrays; their shapes checked against the manifest."""
        m = self.manifest
        try:
            tokens = np.load(self.path / "tokens.npy", mmap_mode="r")
            sa = np.load(self.path / "sa.npy", mmap_mode="r")
        except (ValueError, OSError) as exc:
            raise DatastoreError(f"Cannot read the arrays of {self.path} ({exc}). Rebuild with `{self._rebuild}`.") \
                from exc
        if tokens.dtype != self.dtype or tokens.ndim != 1 or sa.ndim != 1 or len(sa) != m["entries"] \
                or len(tokens) != m["tokens"] + m["documents"] + 1:
            raise DatastoreError(f"The arrays of {self.path} do not match its manifest. Rebuild with "
                                 f"`{self._rebuild}`.")
        return tokens.view(np.ndarray), sa.view(np.ndarray)

    def _checked_vocab(self, vocab: int) -> int:
        """The vocabulary size lookups index by, after checking that every token id fits the model's vocabulary
        (REST's own builder crashed on forgotten added tokens)."""
        real = self.tokens[self.tokens != self.sep]
        top = int(real.max()) if len(real) else -1
        if top >= vocab:
            raise DatastoreError(f"The datastore {self.path} holds token id {top}, out of range for a vocabulary of "
                                 f"{vocab}. It was built for another tokenizer or is corrupt; rebuild with "
                                 f"`{self._rebuild}`.")
        return max(vocab, self.manifest["vocab_size"])

    def _first_token_ranges(self) -> list[int]:
        """Start offsets into the suffix array per first (newest) query token: entries are sorted by tokens[e-1]
        first, so the range for token t is [first[t], first[t + 1])."""
        t = self.tokens
        ok = (t[:-1] != self.sep) & (t[1:] != self.sep)
        counts = np.bincount(t[:-1][ok].astype(np.int64), minlength=self.vocab)
        first = np.concatenate([[0], np.cumsum(counts)]).tolist()
        if first[-1] != len(self.sa):
            raise DatastoreError(f"The suffix array of {self.path} does not match its tokens. Rebuild with "
                                 f"`{self._rebuild}`.")
        return first

    def __len__(self) -> int:
        return int(self.manifest["tokens"])

    def match(self, context: Sequence[int], max_len: int = 16, min_len: int = 2, small: int = 48) -> tuple[int, int, int]:
        """(length, lo, hi): the longest m in [min_len, max_len] whose last-m-token suffix of `context` occurs in the
        store with a continuation; sa[lo:hi] are all its occurrences.  (0, 0, 0) when none."""
        n = min(max_len, len(context))
        if n < max(1, min_len):
            return 0, 0, 0
        t0 = int(context[-1])
        if not 0 <= t0 < len(self._first) - 1:
            return 0, 0, 0
        lo, hi = self._first[t0], self._first[t0 + 1]
        if lo == hi:
            return 0, 0, 0
        T, S = self._tmv, self._smv
        tokens, sa = self.tokens, self.sa
        length = 1
        for k in range(1, n):
            t = int(context[-1 - k])
            if hi - lo <= small:  # small range: read the whole column at once
                col = tokens[sa[lo:hi].astype(np.int64) - 1 - k]
                a = lo + int(np.searchsorted(col, t, "left"))
                b = lo + int(np.searchsorted(col, t, "right"))
            else:  # lower and upper bound of t in column k (sorted inside the range)
                a, b = lo, hi
                while a < b:
                    mid = (a + b) >> 1
                    if T[S[mid] - 1 - k] < t:
                        a = mid + 1
                    else:
                        b = mid
                lo2 = a
                b = hi
                while a < b:
                    mid = (a + b) >> 1
                    if T[S[mid] - 1 - k] <= t:
                        a = mid + 1
                    else:
                        b = mid
                a, b = lo2, a
            if a == b:
                break
            lo, hi, length = a, b, k + 1
        if length < min_len:
            return 0, 0, 0
        return length, lo, hi

    def continuations(self, lo: int, hi: int, max_matches: int = 5000, length: int = 10) -> np.ndarray:
        """(k, length) int64: what followed up to `max_matches` occurrences sampled evenly across sa[lo:hi]; after a
        document separator every entry is the separator."""
        n = hi - lo
        if n <= 0:
            return np.zeros((0, length), dtype=np.int64)
        if n > max_matches:
            idx = lo + (np.arange(max_matches, dtype=np.int64) * n) // max_matches
            ends = self.sa[idx].astype(np.int64)
        else:
            ends = self.sa[lo:hi].astype(np.int64)
        pos = np.minimum(ends[:, None] + np.arange(length), len(self.tokens) - 1)  # the last token is a separator
        rows = self.tokens[pos].astype(np.int64)
        stop = np.maximum.accumulate(rows == self.sep, axis=1)
        rows[stop] = self.sep
        return rows

    def retrieve(self, context: Sequence[int], max_len: int = 16, min_len: int = 2, max_matches: int = 5000,
                 length: int = 10) -> tuple[int, np.ndarray]:
        """(match length, continuations) for the longest suffix match of `context` (length 0: no match)."""
        m, lo, hi = self.match(context, max_len, min_len)
        if not m:
            return 0, np.zeros((0, length), dtype=np.int64)
        return m, self.continuations(lo, hi, max_matches, length)


# ---------------------------------------------------------------------------------------------------------------------
# The default datastore of a model
# ---------------------------------------------------------------------------------------------------------------------
def _slug(identity: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", identity)


def default_dir(identity: str) -> Path:
    """Where the default datastore of a tokenizer lives (REST uses it when no path is given)."""
    return cache_root() / "datastores" / _slug(identity)


