"""A hub id where the hub does not answer: read from the local hub cache at once (a model fetched earlier still
loads), else a clear message at once — not huggingface_hub's retries, ~47 s of a silent page (specdemo/hub.py)."""
from __future__ import annotations

import pytest
import torch

from specdemo import hub
from specdemo.artifacts import resolve_dir
from specdemo.target import ModelLoadError, embedded_dir, load_target


@pytest.fixture
def no_hub(monkeypatch):
    """The hub's endpoint does not answer the probe, and nothing else says offline: huggingface_hub's setting (from
    HF_HUB_OFFLINE, which the suite sets) is off.  A request that `local_files_only` misses would go out and be
    retried; the test fails if any is made."""
    from huggingface_hub import constants, file_download

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_answers", lambda minute: False)
    requests = []

    def no_request(url, *args, **kwargs):
        requests.append(url)
        raise OSError(f"no hub in this test: {url}")

    monkeypatch.setattr(file_download, "get_hf_file_metadata", no_request)
    yield
    assert not requests, f"requests to the hub: {requests}"


class Session:
    """huggingface_hub's session as the probe uses it: records each HEAD, answers or fails as told."""

    def __init__(self, answers: bool):
        self.answers, self.calls = answers, []

    def head(self, url: str, timeout: float):
        self.calls.append((url, timeout))
        if not self.answers:
            raise ConnectionError("no route to host")


def test_the_hub_is_asked_once_a_minute_with_a_short_limit(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    clock = [600.0]
    monkeypatch.setattr(hub.time, "monotonic", lambda: clock[0])
    down = Session(answers=False)
    monkeypatch.setattr("huggingface_hub.utils.get_session", lambda: down)
    hub._answers.cache_clear()
    try:
        assert hub.local_only() and hub.local_only()
        assert len(down.calls) == 1 and down.calls[0][1] == hub.PROBE_TIMEOUT_S
        up = Session(answers=True)
        monkeypatch.setattr("huggingface_hub.utils.get_session", lambda: up)
        assert hub.local_only()  # the same minute: the last answer stands
        clock[0] += hub.PROBE_EVERY_S
        assert not hub.local_only() and len(up.calls) == 1  # a new minute asks again
    finally:
        hub._answers.cache_clear()


def test_offline_set_needs_no_probe(monkeypatch):
    from huggingface_hub import constants

    def probe(minute):
        raise AssertionError("the hub was asked although HF_HUB_OFFLINE is set")

    monkeypatch.setattr(hub, "_answers", probe)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.local_only()


def test_an_unknown_hub_id_fails_at_once_without_a_hub(no_hub, monkeypatch):
    from transformers import AutoTokenizer

    asked = []
    original = AutoTokenizer.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        return original(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(spy))
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model.*cannot be reached"):
        load_target("no-such-org/no-such-model")
    assert asked == [True]  # the cache only: no request for the hub's retries to repeat


def test_a_hub_model_in_the_local_cache_loads_without_a_hub(no_hub, monkeypatch, tmp_path):
    """A model fetched earlier sits in the hub cache's layout (refs/main -> snapshots/<commit>/): it loads, and decodes
    the same as from its folder."""
    from huggingface_hub import constants
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(embedded_dir())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=128, eos_token_id=tok.eos_token_id))
    repo = tmp_path / "models--someone--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))

    cached = load_target("someone/tiny-llama")
    direct = load_target(str(snapshot))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(cached.model(ids).logits, direct.model(ids).logits)


def test_a_drafter_artifact_by_hub_id_fails_at_once_without_a_hub(no_hub, monkeypatch):
    import huggingface_hub

    asked = []
    original = huggingface_hub.snapshot_download

    def spy(*args, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    with pytest.raises(ValueError, match="cannot be reached"):
        resolve_dir("no-such-org/no-such-heads", ("config.json",), "S4C heads", ValueError, "Train some.")
    assert asked == [True]
