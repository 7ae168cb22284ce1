"""Verification forwards replayed as CUDA graphs: one graph per static-shape bucket (static_step.py), captured on the
bucket's first use and replayed with the inputs written in place.

A 135M-parameter model on a GPU spends an eager step launching kernels (~20 ms for some 400 launches, the weights
read in well under a millisecond); a replayed graph launches them as one.  A graph replays fixed kernels on fixed
memory, so the captured forward reads only the bucket's `StepInputs`, the fixed-length cache and the weights: no
Python value, no allocation outside the graph's pool, no host synchronisation (static_step.py's contract).

* Capture: two warm-up forwards on a side stream (cuBLAS picks its kernels and workspace there, outside the graph),
  then one captured forward; all buckets share one memory pool, as only one replays at a time.  The warm-ups and the
  capture write the step's K/V entries at its slots: the same values three times, so the step is unchanged.
* Replay: `StaticSteps.prepare` writes the step's ids, positions, mask and slots; `replay` runs the graph; the output
  buffer (the graph's own) holds the hidden states until the next replay of that bucket.
* Compaction (`keep`) and the LM head stay eager: a handful of kernels.
* Reuse: the engine takes its steps from a pool on the target (`static_step.acquire_steps`), so a bucket's graph is
  captured by the first request of its size and replayed by every later one.

ZeroGPU does not support `torch.compile`; plain `torch.cuda.CUDAGraph` capture inside the `spaces.GPU` worker is the
portable route in principle, but a ZeroGPU worker attaches the GPU per call, so graphs kept across requests may
point at memory that is gone: under ZeroGPU (SPACES_ZERO_GPU) steps stay eager unless SPECDEMO_CUDA_GRAPHS=1 asks.
On by default on other CUDA machines since the H100 run of 2026-11-26 (docs/gpu/): replayed steps gave every mode's
eager tokens (tests/test_cuda_graphs.py) and AR 3.4x the eager step (GenerationConfig.cuda_graphs,
SPECDEMO_CUDA_GRAPHS=0 turns them off).
"""
from __future__ import annotations

import os

import torch

from specdemo.static_step import StaticSteps, StepInputs
from specdemo.tree import TreeBuffers

ENV = "SPECDEMO_CUDA_GRAPHS"
WARMUPS = 2


def wanted(flag: bool | None, device: torch.device) -> bool:
    """Whether a run replays its steps as graphs (CUDA only): the config's flag, else SPECDEMO_CUDA_GRAPHS when set,
    else on except under ZeroGPU."""
    if device.type != "cuda":
        return False
    if flag is not None:
        return flag
    env = os.environ.get(ENV, "").strip()
    if env:
        return env in ("1", "true", "yes")
    return not os.environ.get("SPACES_ZERO_GPU")


class GraphedSteps:
    """StaticSteps whose bucket forwards replay as CUDA graphs; the same interface (`cache`, `forward`, `keep`)."""

    def __init__(self, steps: StaticSteps) -> None:
        self.steps = steps
        self.cache = steps.cache
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def forward(self, ids: list[int], tree: TreeBuffers, past: int) -> torch.Tensor:
        step = self.steps.prepare(ids, tree, past)
        graph = self.graphs.get(step.rows)
        if graph is None:
            graph = self._capture(step)
        graph.replay()
        return self.outputs[step.rows]

    def keep(self, start: int, src: list[int]) -> None:
        self.steps.keep(start, src)

    def reset(self) -> None:
        """A new request: the cache empties, the graphs stay (they read the same buffers)."""
        self.steps.reset()

    @property
    def pool_key(self) -> tuple:
        return self.steps.pool_key

    def _capture(self, step: StepInputs) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUPS):
                self.steps.run(step)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[step.rows] = self.steps.run(step)
        self.pool = graph.pool()
        self.graphs[step.rows] = graph
        return graph
