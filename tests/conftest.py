"""Shared fixtures: the embedded model (loaded once) and tiny randomly initialised Llama / Qwen2 models saved to disk
and loaded through the same `load_target(path)` path a hub id takes."""
from __future__ import annotations

import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from specdemo.engine import DecodeState, Drafter  # noqa: E402
from specdemo.precision import int4_available  # noqa: E402
from specdemo.target import embedded_dir, load_target  # noqa: E402
from specdemo.tree import DraftTree  # noqa: E402


@pytest.fixture(scope="session")
def embedded():
    from specdemo.offline.build_datastore import ensure_default

    target = load_target("embedded")
    ensure_default(target, progress=False)  # REST's default store, as `make setup` builds it
    return target


def _tiny(kind: str, tmp_path_factory) -> "object":
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = AutoTokenizer.from_pretrained(embedded_dir())
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.5, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    path = tmp_path_factory.mktemp(f"tiny-{kind}")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return load_target(str(path))


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return _tiny("llama", tmp_path_factory)


needs_int4 = pytest.mark.skipif(not int4_available(), reason="no int4 CPU kernel or no native bf16 on this CPU")
REDUCED = ["bf16", pytest.param("int4", marks=needs_int4)]  # the CPU precisions below fp32


def at_precision(tiny, precision: str):
    """The tiny model's checkpoint loaded on the CPU at `precision`."""
    return load_target(str(tiny.model.name_or_path), device="cpu", precision=precision)


def on_cpu(target):
    """The same checkpoint loaded on the CPU (the target itself on a CPU host), for the tests of claims about the
    CPU's kernels and tree sizes (bit-exact padding, the CPU cost curve's budgets), which a GPU's kernels do not make:
    its products round differently with their shapes, and its trees are sized by its own curve."""
    if target.device.type == "cpu":
        return target
    if "cpu copy" not in target.artifacts:
        target.artifacts["cpu copy"] = load_target(target.name, device="cpu")
    return target.artifacts["cpu copy"]


def tolerance(target) -> float:
    """rtol and atol of the tests' comparisons of one forward's rows with another's (a tree's rows with a whole
    sequence's): 1e-4 on a CPU; 1e-3 on a GPU, the tree self-check's own bound, because its fp32 products pick other
    kernels for other shapes and differ at ~1e-4 of the values."""
    return 1e-4 if target.device.type == "cpu" else 1e-3


def cpu_processes_env() -> dict[str, str]:
    """The environment of the tests' `accelerate launch`: CPU processes (gloo) even on a host with a GPU, where
    --multi_gpu would give each process a GPU of its own (and process 1 one that a one-GPU host lacks).  The tests'
    one-process reference runs pass --device cpu, so both sides compute on the same device."""
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


class OracleDrafter(Drafter):
    """Knows the reference output; proposes trees where the true continuation hides among wrong branches.

    Exercises every acceptance shape: nothing accepted, partial paths, full paths, the right child not being the
    first child, duplicate sibling tokens, probe nodes.
    """

    name = "oracle"

    def __init__(self, reference: list[int], vocab: int, seed: int = 0, probes: bool = False):
        self.reference, self.vocab, self.rng, self.probes = reference, vocab, random.Random(seed), probes

    def propose(self, state: DecodeState) -> DraftTree:
        done = len(state.generated)
        truth = self.reference[done : done + self.rng.randint(0, 6)]
        if self.rng.random() < 0.2 and truth:  # corrupt the truth somewhere
            truth = list(truth)
            truth[self.rng.randrange(len(truth))] = self.rng.randrange(self.vocab)
        tokens, parents, probe = [], [], []
        parent = -1
        for tok in truth:
            for _ in range(self.rng.randint(0, 2)):  # wrong siblings before the true child
                tokens.append(self.rng.randrange(self.vocab))
                parents.append(parent)
                probe.append(False)
            tokens.append(tok)
            parents.append(parent)
            probe.append(False)
            parent = len(tokens) - 1
            if self.probes and self.rng.random() < 0.5:  # a probe hanging off the true node: must never be accepted
                tokens.append(self.reference[min(done + len(tokens), len(self.reference) - 1)])
                parents.append(parent)
                probe.append(True)
        return DraftTree(tokens, parents, ["oracle"] * len(tokens), probe)
