"""`python -m specdemo acceptance`: tau and acceptance by depth from the engine's events, nothing timed."""
from __future__ import annotations

import json

import pytest

from specdemo import acceptance, cli
from specdemo.budget import CURVE_SIZES, CURVES, INT4_CURVE_SIZES, pin_cost_curves
from specdemo.engine import StepEvent
from specdemo.tree import DraftTree

SIZES = ",".join(map(str, INT4_CURVE_SIZES))  # every size: the curve serves a model at any precision
FLAT = {SIZES: {str(s): 1.0 for s in INT4_CURVE_SIZES}}  # every tree costs an AR step: drafting always pays


def event(tree: DraftTree, accepted: list[int], tokens: list[int]) -> StepEvent:
    return StepEvent(0, tokens, [True] * len(accepted) + [False], [None] * len(tokens), tree, accepted, 0.0, 0.0, 0,
                     0)


def test_figures_from_events():
    chain = DraftTree.chain([5, 6, 7])  # depth 3
    fork = DraftTree([5, 9, 6], [-1, -1, 0])  # depth 2: 5 -> 6, and 9
    probe = DraftTree([5, 8], [-1, 0], probe=[False, True])  # the probe adds no depth
    runs = [[event(chain, [0, 1], [5, 6, 1]), event(fork, [], [2])],
            [event(probe, [0], [5, 3]), event(DraftTree.empty(), [], [4])]]
    refs = [[5, 6, 1, 2], [5, 3, 0]]  # the second prompt's tokens differ from its reference
    rel = {0: 1.0, 1: 1.0, 2: 1.5, 3: 2.0}
    f = acceptance.method_figures(runs, refs, rel)
    assert f["tau"] == 7 / 4 and f["new_tokens"] == 7 and f["forwards"] == 4
    assert f["mean_nodes"] == 2.0 and f["empty_steps"] == 0.25
    assert f["modelled_speedup"] == round(7 / (2.0 + 2.0 + 1.5 + 1.0), 4)
    assert f["identical"] == 0.5
    # steps accepting >= 1, 2, 3 drafts: 2, 1, 0 of 4
    assert f["accepted_share"][:3] == [0.5, 0.25, 0.0]
    assert f["conditional"][:3] == [0.5, 0.5, 0.0]
    # trees reaching depth 1, 2, 3: 3 (chain, fork, probe), 2 (chain, fork), 1 (chain); the probe tree reaches 1 only
    assert f["given_reached"][:4] == [round(2 / 3, 4), 0.5, 0.0, None]
    assert acceptance.method_figures(runs, [None, None], rel)["identical"] is None


def test_step_depth_ignores_probes():
    assert acceptance.step_depth(event(DraftTree([1, 2, 3], [-1, 0, 1], probe=[False, True, True]), [], [0])) == 1
    assert acceptance.step_depth(event(DraftTree.empty(), [], [0])) == 0


def test_options_are_parsed_as_the_bench_parses_them():
    assert acceptance.parse_options(["pld:short.num_tokens=2", "pld.adaptive=false"]) == {
        "pld:short": {"num_tokens": 2}, "pld": {"adaptive": False}}
    with pytest.raises(ValueError, match="METHOD.NAME=VALUE"):
        acceptance.parse_options(["pld=2"])


@pytest.fixture
def flat_curves(tiny_llama):
    saved = tiny_llama.artifacts.pop(CURVES, None)
    pin_cost_curves(tiny_llama, FLAT)
    yield tiny_llama
    tiny_llama.artifacts.pop(CURVES, None)
    if saved is not None:
        tiny_llama.artifacts[CURVES] = saved


def test_run_acceptance_checks_against_ar_and_labels_variants(flat_curves):
    t = flat_curves
    prompts = [{"id": "a", "prompt": "one two three one two three one two three one two"},
               {"id": "b", "prompt": "alpha beta gamma alpha beta gamma alpha beta"}]
    res = acceptance.run_acceptance(t, ["pld", "pld:short"], prompts, 12, options={"pld:short": {"num_tokens": "2"}})
    assert list(res["methods"]) == ["ar", "pld", "pld:short"]
    ar = res["methods"]["ar"]
    assert ar["tau"] == 1.0 and ar["mean_nodes"] == 0.0 and ar["conditional"][0] == 0.0
    for m in res["methods"].values():
        assert m["identical"] == 1.0 and m["tau"] >= 1.0
        assert m["modelled_speedup"] == m["tau"]  # a flat cost curve: every step costs one AR step
    assert res["relative_cost"] == {str(s): 1.0 for s in CURVE_SIZES}
    unchecked = acceptance.run_acceptance(t, ["pld"], prompts[:1], 8, check=False)
    assert list(unchecked["methods"]) == ["pld"] and unchecked["methods"]["pld"]["identical"] is None


def test_cli_writes_the_json_and_reads_pinned_curves(tiny_llama, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "x", "prompt": "one two three one two three one two"}) + "\n")
    bench_json = tmp_path / "bench.json"
    bench_json.write_text(json.dumps({"cost_curves": FLAT}))
    out = tmp_path / "acc.json"
    rc = cli.main(["acceptance", "--model", str(tiny_llama.model.name_or_path), "--methods", "pld",  # loads it anew
                   "--prompts", str(prompts), "--limit", "1", "--max-new-tokens", "6",
                   "--cost-curves", str(bench_json), "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res["methods"]) == ["ar", "pld"] and res["prompts"] == 1 and res["max_new_tokens"] == 6
    assert "pld" in capsys.readouterr().out
    assert cli.main(["acceptance", "--limit", "0"]) == 2  # refused before any model loads
