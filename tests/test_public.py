"""The public mode: no server paths, an allow-list, a parameter cap checked from the config; the local mode is free."""
from __future__ import annotations

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo.app import public
from specdemo.app.public import (
    PublicModeRefusal,
    check_model,
    check_options,
    count_params,
)
from specdemo.app.request import UserError, race_request
from specdemo.app.racing import run_race
from specdemo.app.request import RaceRequest
from specdemo.target import ModelLoadError, load_target

TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=False)


@pytest.fixture
def public_on(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv("SPECDEMO_PUBLIC", "1")
    monkeypatch.delenv("SPECDEMO_MODELS", raising=False)
    monkeypatch.delenv("SPECDEMO_MAX_PARAMS", raising=False)


def test_the_mode_follows_the_environment(monkeypatch):
    monkeypatch.delenv("SPECDEMO_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not public.public_mode()
    monkeypatch.setenv("SPACE_ID", "someone/specdemo")
    assert public.public_mode()
    monkeypatch.setenv("SPECDEMO_PUBLIC", "0")
    assert not public.public_mode()  # a Space may opt out explicitly
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("SPECDEMO_PUBLIC", "1")
    assert public.public_mode()


def test_count_params_matches_the_built_model():
    cfg = LlamaConfig(**TINY)
    assert count_params(cfg) == sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())


@pytest.mark.parametrize("name", ["/etc", "../../../../etc/passwd", ".", "~/models/x", "a/b/c", "owner/na me",
                                  "owner/..", "x" * 300])
def test_paths_and_odd_names_are_refused(public_on, name):
    with pytest.raises(PublicModeRefusal, match="hub id"):
        check_model(name, config_of=lambda n: pytest.fail("no config may be fetched for a refused name"))


def test_allow_list_and_parameter_cap(public_on, monkeypatch):
    small = lambda name: LlamaConfig(**TINY)  # noqa: E731
    check_model("embedded", config_of=small)  # always served
    check_model("owner/tiny", config_of=small)
    monkeypatch.setenv("SPECDEMO_MAX_PARAMS", "1000")
    with pytest.raises(PublicModeRefusal, match="up to 0.00B \\(SPECDEMO_MAX_PARAMS\\)"):
        check_model("owner/tiny", config_of=small)
    monkeypatch.setenv("SPECDEMO_MODELS", "owner/allowed")
    with pytest.raises(PublicModeRefusal, match="serves these models only: embedded, owner/allowed"):
        check_model("owner/tiny", config_of=small)
    with pytest.raises(PublicModeRefusal, match="Cannot read the config"):
        check_model("owner/allowed", config_of=lambda n: (_ for _ in ()).throw(OSError("offline")))


def test_default_cap_is_sized_to_the_machine(public_on):
    assert 10**8 < public.max_params() < 10**12


def test_server_paths_in_options_are_refused(public_on):
    check_options("rest", {"datastore": "default", "budget": 16})
    check_options("rest", {"datastore": "none"})
    with pytest.raises(PublicModeRefusal, match="option datastore takes 'default' or 'none' here"):
        check_options("rest", {"datastore": "/etc"})
    with pytest.raises(UserError, match="does not open server paths: option heads takes its default"):
        race_request("Hi", "s4c", options={"heads": "/root/heads"})


def test_a_refused_model_is_a_message_in_the_race(public_on):
    final = list(run_race(RaceRequest("Hello", ("pld",), "/etc", max_new_tokens=4)))[-1]
    assert final.status == "error" and "hub id" in final.message


def test_local_mode_keeps_its_freedom(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_PUBLIC", "0")
    check_model("/etc", config_of=lambda n: pytest.fail("no check in the local mode"))
    check_options("rest", {"datastore": str(tmp_path)})
    with pytest.raises(ModelLoadError, match="that local path is not a model folder"):
        load_target(str(tmp_path))
