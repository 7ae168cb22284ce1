"""CUDA-graph replay of the static-shape verification (cuda_graphs.py): on a GPU, graph-replayed decoding gives the
tokens of eager static-shape decoding for every drafter; everywhere, the switch keeps CPUs on the eager path."""
from __future__ import annotations

import pytest
import torch

from specdemo import cuda_graphs
from specdemo.drafters import make_drafter
from specdemo.engine import GenerationConfig, run_to_end


def test_graphs_are_off_on_a_cpu_and_opt_in_on_cuda(monkeypatch):
    monkeypatch.setenv(cuda_graphs.ENV, "1")
    assert not cuda_graphs.wanted(True, torch.device("cpu"))
    assert cuda_graphs.wanted(None, torch.device("cuda"))
    monkeypatch.delenv(cuda_graphs.ENV)
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
