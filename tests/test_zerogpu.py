"""What crosses the ZeroGPU boundary: the `spaces.GPU` functions run in a GPU worker process, so everything they take
and give back is pickled; it must be plain data (no tensors, which would hold the worker's CUDA memory)."""
from __future__ import annotations

import io
import pickle

import pytest
import torch

from specdemo.app.page.handlers import _bench
from specdemo.app.racing import _race_events, prepare
from specdemo.app.request import race_all_request


class _NoTensors(pickle.Pickler):
    """A pickler that refuses tensors anywhere in the object graph."""

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            raise AssertionError(f"a tensor crosses the boundary: {tuple(obj.shape)} {obj.dtype} on {obj.device}")
        return None


def plain(value) -> object:
    """`value` pickled without tensors and read back."""
    buf = io.BytesIO()
    _NoTensors(buf).dump(value)
    return pickle.loads(buf.getvalue())


@pytest.fixture(scope="module", autouse=True)
def shared_model(embedded):
    from specdemo.app.models import MODELS

    MODELS.put("embedded", embedded)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_race_takes_and_yields_plain_data(temperature):
    req = race_all_request("Write a haiku about the sea.", "embedded", 12, temperature, 0.9, 0, 11)
    prep = prepare(req)
    args = (req.model, prep.ids, prep.config, prep.methods, req.options)
    assert plain(args) == args
    seen = set()
    for lane, event in _race_events(*args):
        copy = plain((lane, event))
        assert copy[1].tokens == event.tokens and copy[1].tree.tokens == event.tree.tokens
        seen.add(lane)
    assert seen == {"ar", *prep.methods}


def test_the_bench_returns_plain_data():
    args = ("embedded", ["pld"], [{"id": "p", "prompt": "Say hi."}], 8)
    assert plain(args) == args
    result = _bench(*args, warmup=False)
    assert plain(result) == result


def test_the_code_runs_on_python_3_10():
    """ZeroGPU runs Python 3.10.13: no syntax or standard-library use newer than 3.10 (vermin reads every file)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([str(Path(sys.executable).with_name("vermin")), "-t=3.10-", "--no-tips", "--violations",
                          "--eval-annotations", "--no-parse-comments", "specdemo", "app.py", "scripts", "tests"],
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stdout + out.stderr
