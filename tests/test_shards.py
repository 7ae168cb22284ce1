"""Sharded distillation (offline/shards.py): a fixed manifest, shards shared out over processes, resume, the glob the
trainers read, and `accelerate launch` with two CPU processes writing the shards one process writes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import cpu_processes_env
from specdemo import cli
from specdemo.offline import corpus, shards


def _prompts(tmp_path, n: int = 7):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i} things about the number {i}."}) + "\n"
                            for i in range(n)))
    return path


def _distill(model: str, prompts, out, *extra: str) -> list[str]:
    return ["distill", "--model", model, "--prompts", str(prompts), "--out", f"{out}/", "--shard-prompts", "3",
            "--max-new-tokens", "4", "--batch-size", "2", "--device", "cpu", *extra]


def test_shards_are_shared_out_without_overlap():
    manifest = {"shards": [[str(i)] for i in range(7)]}
    mine = [shards.my_shards(manifest, r, 3) for r in range(3)]
    assert sorted(k for m in mine for k in m) == list(range(7)) and mine[0] == [0, 3, 6]
    assert shards.my_shards(manifest, 0, 1, limit=2) == [0, 1]


def test_globs_and_directories_expand(tmp_path):
    for k in range(3):
        (tmp_path / f"shard-00{k}.jsonl.gz").write_bytes(b"")
    want = [tmp_path / f"shard-00{k}.jsonl.gz" for k in range(3)]
    assert corpus.expand([tmp_path]) == want == corpus.expand([str(tmp_path / "shard-*.jsonl.gz")])
    with pytest.raises(FileNotFoundError, match="no training data matches"):
        corpus.expand([str(tmp_path / "nothing-*.gz")])


def test_sharded_distillation_writes_resumes_and_reads_back(tmp_path, tiny_llama):
    model, prompts, out = str(tiny_llama.model.name_or_path), _prompts(tmp_path), tmp_path / "corpus"
    assert cli.main(_distill(model, prompts, out, "--shards", "1")) == 0  # the first shard only
    manifest = json.loads((out / shards.MANIFEST).read_text())
    assert [len(s) for s in manifest["shards"]] == [3, 3, 1] and "distill" in manifest["command"]
    assert shards.finished(shards.shard_path(out, 0), manifest["shards"][0])
    assert not shards.shard_path(out, 1).exists()
    first = shards.shard_path(out, 0).read_bytes()
    assert cli.main(_distill(model, prompts, out)) == 0  # resumes: shard 0 untouched, the others written
    assert shards.shard_path(out, 0).read_bytes() == first
    records = corpus.read_records([out])
    assert sorted(r["id"] for r in records) == [f"p{i}" for i in range(7)]
    header, _ = corpus.read_corpus(shards.shard_path(out, 2))
    assert header["command"] == manifest["command"]


def test_skip_leaves_out_what_a_corpus_already_holds(tmp_path, tiny_llama):
    model, prompts = str(tiny_llama.model.name_or_path), _prompts(tmp_path)
    assert cli.main(_distill(model, prompts, tmp_path / "a", "--shards", "1")) == 0
    assert cli.main(_distill(model, prompts, tmp_path / "b", "--skip", str(tmp_path / "a" / "shard-*.jsonl.gz"),
                             "--shards", "0")) == 0
    manifest = json.loads((tmp_path / "b" / shards.MANIFEST).read_text())
    assert sorted(i for s in manifest["shards"] for i in s) == [f"p{i}" for i in range(3, 7)]


@pytest.mark.slow
def test_accelerate_launch_with_two_processes_writes_the_same_shards(tmp_path, tiny_llama):
    if shutil.which("accelerate", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("accelerate's launcher is not installed")
    model, prompts = str(tiny_llama.model.name_or_path), _prompts(tmp_path)
    assert cli.main(_distill(model, prompts, tmp_path / "one")) == 0
    launcher = os.path.join(os.path.dirname(sys.executable), "accelerate")
    env = cpu_processes_env()
    # --multi_gpu is accelerate's torchrun launcher; with CUDA hidden its processes run on the CPU (gloo).
    # (`--cpu --num_processes 2` would start ONE process: accelerate's simple launcher.)
    done = subprocess.run([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29517",
                           "-m", "specdemo", *_distill(model, prompts, tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(process 0)" in done.stdout and "(process 1)" in done.stdout  # two processes shared the shards
    for k in range(3):
        one = corpus.read_corpus(shards.shard_path(tmp_path / "one", k))[1]
        two = corpus.read_corpus(shards.shard_path(tmp_path / "two", k))[1]
        key = lambda r: r["id"]  # noqa: E731
        assert sorted(one, key=key) == sorted(two, key=key)


def test_exported_prompts_are_what_distill_reads_back_less_the_skipped(tmp_path, tiny_llama, capsys):
    """`--export-prompts` carries prompts to a machine without the ShareGPT package: `--prompts PATH` there reads the
    same ids and messages, less those a --skip corpus already answers."""
    from specdemo.offline.distill import prompt_specs

    model, prompts, out = str(tiny_llama.model.name_or_path), _prompts(tmp_path), tmp_path / "corpus"
    assert cli.main(_distill(model, prompts, out, "--shards", "1")) == 0  # shard 0 answers p0-p2
    exported = tmp_path / "carry" / "prompts.jsonl.gz"
    assert cli.main(["distill", "--prompts", str(prompts), "--skip", str(out), "--export-prompts", str(exported)]) == 0
    back = prompt_specs(str(exported), 0, 0, 0)
    assert [s["id"] for s in back] == [f"p{i}" for i in range(3, 7)]
    assert back == [s for s in prompt_specs(str(prompts), 0, 0, 0) if s["id"] not in {"p0", "p1", "p2"}]
    assert cli.main(["distill", "--prompts", str(prompts)]) != 0
    assert "needs --out" in capsys.readouterr().err
