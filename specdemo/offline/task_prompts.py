"""Task-style prompts for self-distillation, built from ShareGPT's own text (`distill --prompts tasks`).

Why: heads trained on ShareGPT's chat turns draft a chat answer's tokens well (head 1 right on ~53% of held-out
positions) but a translation's, a summary's or a grounded answer's far less (~17-30% on such answers): those tasks
are a few percent of ShareGPT's turns.  The field's benchmark weighs them equally with chat, so the drafters need the
target's own answers to such requests.  The requests are built here from ShareGPT's text, never from an evaluation
set (the distiller's decontamination drops any answer sharing a 10-gram with one):

* summarisation -- "Summarize the following ..." over an assistant answer of 120-600 words;
* grounded QA   -- an assistant answer as the passage, and the user question it answered, asked about it;
* translation   -- German, French or Spanish sentences of ShareGPT's turns (by a stop-word share), "Translate ... to
                   English".

Every prompt's id names its kind and source turn (`task:<kind>:<conversation>:<turn>`), and the shared held-out split
(`sharegpt.is_heldout_record`) keeps it on its conversation's side: prompts come from training conversations only.
"""
from __future__ import annotations

import hashlib
import re

from specdemo.offline import sharegpt

KINDS = ("summarize", "grounded", "translate")
_SUMMARY_ASKS = ("Summarize the following text.", "Write a short summary of this article.",
                 "Summarize the text below in a few sentences.", "Give me a brief summary of the following.")
_STOPWORDS = {
    "German": {"der", "die", "und", "nicht", "ist", "ich", "das", "mit", "sie", "auf", "für", "ein", "eine", "zu",
               "den", "von", "sich", "auch", "wir", "es", "werden", "wird", "dem", "oder", "kann"},
    "French": {"le", "la", "les", "et", "est", "une", "des", "pour", "dans", "que", "qui", "pas", "sur", "vous",
               "avec", "nous", "ce", "du", "au", "sont", "mais"},
    "Spanish": {"el", "los", "las", "y", "es", "una", "para", "por", "que", "con", "del", "se", "su", "como", "pero",
                "más", "está", "son", "al", "lo"},
}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _hash_order(key: str) -> bytes:
    return hashlib.blake2b(f"tasks:{key}".encode(), digest_size=8).digest()


def language_of(text: str) -> str | None:
    """The language whose stop words make up >= 25% of `text`'s words (at least 8 words), or None."""
    ws = sharegpt.words(text)
    if len(ws) < 8:
        return None
    best = max(_STOPWORDS, key=lambda lang: sum(w in _STOPWORDS[lang] for w in ws))
    return best if sum(w in _STOPWORDS[best] for w in ws) >= 0.25 * len(ws) else None


def _translations(conv: sharegpt.Conversation, turn: int, text: str) -> list[dict]:
    """One request per run of 1-3 foreign sentences of 8-60 words in `text`."""
    out, chunk = [], []
    for sentence in _SENTENCE.split(text) + [""]:
        lang = language_of(sentence) if sentence else None
        if lang is not None and len(chunk) < 3 and 8 <= len(sentence.split()) <= 60:
            chunk.append((lang, sentence.strip()))
            continue
        if chunk:
            lang = chunk[0][0]
            body = " ".join(s for _, s in chunk)
            out.append({"id": f"task:translate:{conv.id}:{turn}:{len(out)}",
                        "messages": [{"role": "user", "content": f"Translate {lang} to English: {body}"}]})
            chunk = []
    return out


def task_prompts(convs: list[sharegpt.Conversation], per_kind: int, heldout: bool = False) -> list[dict]:
    """Up to `per_kind` (0: every) {"id", "messages"} prompts of each kind from the training conversations (held-out
    ones with `heldout`), in a stable hash order so that a larger request extends a smaller one."""
    found: dict[str, list[dict]] = {k: [] for k in KINDS}
    for conv in convs:
        if conv.heldout != heldout:
            continue
        chat = conv.chat
        for i, t in enumerate(chat):
            text, n_words = t["content"], len(t["content"].split())
            if t["role"] == "assistant" and 120 <= n_words <= 600:
                ask = _SUMMARY_ASKS[_hash_order(conv.id)[0] % len(_SUMMARY_ASKS)]
                found["summarize"].append({"id": f"task:summarize:{conv.id}:{i}", "messages": [
                    {"role": "user", "content": f"{ask}\n\n{text}"}]})
                question = chat[i - 1]["content"] if i > 0 else ""
                if 4 <= len(question.split()) <= 40:
                    found["grounded"].append({"id": f"task:grounded:{conv.id}:{i}", "messages": [
                        {"role": "user", "content": f"Answer the question using the passage.\n\nPassage: {text}\n\n"
                                                    f"Question: {question}"}]})
            found["translate"] += _translations(conv, i, text)
    out = []
    for kind in KINDS:
        pool = sorted(found[kind], key=lambda s: _hash_order(s["id"]))
        out += pool[: per_kind or None]
    return out
