"""llama.cpp as the bench's peer: `llamacpp` (plain decoding) and `llamacpp-pld` (its prompt-lookup decoding) on the
embedded model's own GGUF, through llama-cpp-python (an optional extra: `make peers` compiles it for this CPU).

Why: it is what a CPU user would run instead of this engine, on the same file, so its rows say how far the engine is
from the hardware.  Each run starts from an empty context (`reset`), so it prefills the whole prompt as our runs do
(llama-cpp-python would otherwise reuse the chat template's prefix from the previous prompt), uses as many threads as
torch, and stops at an end-of-sequence token or `max_new_tokens`.  Greedy is `top_k=1`; its identical column is
measured against our AR, whose weights and kernels differ (expect near-ties to part).
"""
from __future__ import annotations

import importlib.util
import os
import time

import torch

PEER_METHODS = ("llamacpp", "llamacpp-pld")
PLD_TOKENS = 10  # as `hf-pld`: transformers' prompt_lookup_num_tokens=10
CONTEXT = 2048  # prompt + answer; llamacpp-pld keeps logits for every position (CONTEXT x vocab floats)


def available() -> str | None:
    """None when llama-cpp-python is installed, else what to run."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed: run `make peers` (compiles llama.cpp, ~5-10 min on 2 cores)"
    return None


def _llama(target, method: str):
    """The target's llama.cpp model for `method`, loaded once and kept on the target."""
    key = f"peer:{method}"
    if key not in target.artifacts:
        why = available()
        if why:
            raise RuntimeError(why)
        if target.name != "embedded":
            raise RuntimeError(f"{method} runs the embedded model's GGUF only, not {target.name}")
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from specdemo.target import embedded_gguf_path

        draft = LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS) if method == "llamacpp-pld" else None
        threads = torch.get_num_threads()
        saved = [os.dup(1), os.dup(2)]  # llama-cpp-python silences the load by redirecting them and may not restore
        try:
            target.artifacts[key] = Llama(model_path=str(embedded_gguf_path()), n_ctx=CONTEXT, n_threads=threads,
                                          n_threads_batch=threads, draft_model=draft, logits_all=draft is not None,
                                          verbose=False, seed=0)
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
    return target.artifacts[key]


def run_peer(target, method: str, prompt_ids: list[int], max_new_tokens: int, sampling) -> dict:
    """One prompt through llama.cpp: the bench's run record (no accepted lengths: llama.cpp does not report them)."""
    llm = _llama(target, method)
    llm.reset()
    greedy = sampling.greedy
    kw = dict(top_k=1, temp=0.0) if greedy else dict(temp=sampling.temperature, top_p=sampling.top_p,
                                                     top_k=sampling.top_k or 0)
    if not greedy:
        llm.set_seed(sampling.seed)
    tokens: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(prompt_ids, reset=True, **kw):
        tokens.append(int(tok))
        if tok in target.eos_ids or len(tokens) >= max_new_tokens:
            break
    return {"tokens": tokens, "wall_time": time.perf_counter() - t0, "accept_lengths": [], "draft_s": [],
            "verify_s": []}
