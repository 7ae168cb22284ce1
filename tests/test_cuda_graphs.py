"""CUDA-graph replay of the static-shape verification (cuda_graphs.py): on a GPU, graph-replayed decoding gives the
tokens of eager static-shape decoding for every drafter; everywhere, the switch keeps CPUs on the eager path."""
from __future__ import annotations

import pytest
import torch

from specdemo import cuda_graphs
from specdemo.drafters import make_drafter
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.static_step import idle_steps


def test_graphs_are_off_on_a_cpu_and_on_for_cuda_except_under_zerogpu(monkeypatch):
    monkeypatch.setenv(cuda_graphs.ENV, "1")
    assert not cuda_graphs.wanted(True, torch.device("cpu"))
    assert cuda_graphs.wanted(None, torch.device("cuda"))
    monkeypatch.setenv(cuda_graphs.ENV, "0")
    assert not cuda_graphs.wanted(None, torch.device("cuda")) and cuda_graphs.wanted(True, torch.device("cuda"))
    monkeypatch.delenv(cuda_graphs.ENV)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert cuda_graphs.wanted(None, torch.device("cuda"))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert not cuda_graphs.wanted(None, torch.device("cuda")) and cuda_graphs.wanted(True, torch.device("cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["none", "pld", "rest"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_replayed_steps_give_the_eager_static_tokens(embedded, method, temperature):
    from specdemo.sampling import SamplingConfig

    ids = embedded.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    tokens = {}
    for graphs in (False, True):
        cfg = GenerationConfig(max_new_tokens=48, sampling=SamplingConfig(temperature=temperature, seed=3),
                               static_shapes=True, cuda_graphs=graphs)
        drafter = None if method == "none" else make_drafter(method, embedded)
        tokens[graphs] = run_to_end(embedded, ids, drafter, cfg)[0]
    assert tokens[True] == tokens[False]


class FakeGraphs(cuda_graphs.GraphedSteps):
    """GraphedSteps that replay nothing (no CUDA here): they note which runs would have replayed graphs."""

    made: list["FakeGraphs"] = []

    def __init__(self, steps) -> None:
        super().__init__(steps)
        FakeGraphs.made.append(self)

    def forward(self, ids, tree, past):
        return self.steps.forward(ids, tree, past)


def test_a_drafter_that_hooks_the_forward_never_replays_graphs(tiny_llama, monkeypatch):
    """A graph replays the kernels of its capture, hooks included: SDSAT's adapter hooks sit at each step's probe
    rows, so its steps stay eager (and in a pool of their own), while other drafters' steps replay."""
    from conftest import OracleDrafter

    monkeypatch.setattr(cuda_graphs, "wanted", lambda flag, device: True)
    monkeypatch.setattr(cuda_graphs, "GraphedSteps", FakeGraphs)
    idle_steps(tiny_llama).clear()
    FakeGraphs.made = []
    prompt = [321, 654, 987, 111] * 3
    cfg = GenerationConfig(max_new_tokens=16, static_shapes=True)
    ref, _ = run_to_end(tiny_llama, prompt, None, GenerationConfig(max_new_tokens=16, static_shapes=False))

    class Hooking(OracleDrafter):
        hooks_forward = True

    assert run_to_end(tiny_llama, prompt, Hooking(ref, 3000, probes=True), cfg)[0] == ref
    assert FakeGraphs.made == []
    assert run_to_end(tiny_llama, prompt, OracleDrafter(ref, 3000), cfg)[0] == ref
    assert len(FakeGraphs.made) == 1
    from specdemo.drafters.sdsat.drafter import SDSATDrafter

    assert SDSATDrafter.hooks_forward  # the real drafter that hooks
