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
@pytest.mark.parametrize("method", ["none", "pld", "rest", "s4c", "sdsat"])
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


def test_graphs_follow_the_drafters_forward(tiny_llama, monkeypatch):
    """A graph replays the kernels of its capture, hooks included: a drafter whose forward changes per step
    (graph_key None) never replays graphs; one with a forward of its own (SDSAT's graph-safe hooks) gets graphs of
    its own; plain drafters share theirs."""
    from conftest import OracleDrafter

    from specdemo.drafters.sdsat.drafter import SDSATDrafter

    monkeypatch.setattr(cuda_graphs, "wanted", lambda flag, device: True)
    monkeypatch.setattr(cuda_graphs, "GraphedSteps", FakeGraphs)
    idle_steps(tiny_llama).clear()
    FakeGraphs.made = []
    prompt = [321, 654, 987, 111] * 3
    cfg = GenerationConfig(max_new_tokens=16, static_shapes=True)
    ref, _ = run_to_end(tiny_llama, prompt, None, GenerationConfig(max_new_tokens=16, static_shapes=False))

    class Hooking(OracleDrafter):
        graph_key = None

    assert run_to_end(tiny_llama, prompt, Hooking(ref, 3000, probes=True), cfg)[0] == ref
    assert FakeGraphs.made == []
    assert run_to_end(tiny_llama, prompt, OracleDrafter(ref, 3000), cfg)[0] == ref
    assert run_to_end(tiny_llama, prompt, None, cfg)[0] == ref
    assert len(FakeGraphs.made) == 1  # the oracle's and AR's forwards are the same: one pooled entry
    from test_sdsat import _noisy_adapter

    sdsat = SDSATDrafter(tiny_llama, _noisy_adapter(tiny_llama), k=2)
    sdsat.masked_rows = False  # a CPU's hooks: on the probe rows alone
    assert sdsat.graph_key is None
    sdsat.masked_rows = True  # CUDA's graph-safe hooks
    assert run_to_end(tiny_llama, prompt, sdsat, cfg)[0] == ref
    assert len(FakeGraphs.made) == 2 and [k[-1] for k, _ in idle_steps(tiny_llama)].count(sdsat.graph_key) == 1
