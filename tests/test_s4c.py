"""S4C: head shapes, inference/training consistency, tree invariants, training loop, artifact round trip and refusal,
greedy + sampling losslessness (tiny models with untrained heads; the embedded model with the shipped heads)."""
from __future__ import annotations

import gzip
import json
import types

import pytest
import torch

from conftest import cpu_processes_env
from specdemo.drafters import DrafterUnavailable, make_drafter, unavailable_reason
from specdemo.drafters.s4c.draft_step import DraftScores
from specdemo.drafters.s4c.drafter import S4CDrafter
from specdemo.drafters.s4c.heads import (
    EMBEDDED_HEADS,
    S4CArtifactError,
    S4CHeads,
    load_heads,
    save_heads,
)
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.offline.feature_store import FeatureStore, extract
from specdemo.offline.train_s4c import unrolled_losses
from specdemo.sampling import SamplingConfig

PROMPT = "Write a Python function that adds two numbers."


def _heads(target, seed=0, n_heads=3):
    torch.manual_seed(seed)
    h = S4CHeads(target, n_heads, 96, torch.arange(3000))
    # perturb the pass-through init so heads are not trivially identical
    with torch.no_grad():
        for p in h.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return h.eval().requires_grad_(False)


def test_head_shapes(tiny):
    heads = _heads(tiny)
    d = tiny.model.config.hidden_size
    ids = torch.randint(0, 3000, (2, 7), device=tiny.device)
    feat = torch.randn(2, 7, d, device=tiny.device)
    out = heads.head(0, heads.embed(ids), feat, torch.arange(7, device=tiny.device).expand(2, 7))
    assert out.shape == (2, 7, d)
    assert heads.lm_weight().shape == (3000, d)
    assert type(heads.layers[0]) is type(tiny.decoder.layers[0])  # the target's own decoder-layer class


def _unrolled_heads(t, heads, seq: list[int], start: int = 0) -> list[torch.Tensor]:
    """Each head's outputs as training computes them: unrolled over seq[start:] (the trainer's prompt crop), with
    positions numbered from 0 and head h fed the tokens h + 1 ahead."""
    with torch.no_grad():
        u = t.decoder(input_ids=torch.tensor([seq], device=t.device)).last_hidden_state[:, start:]  # (1, T, d)
        T = u.shape[1]
        emb = heads.embed(torch.tensor([seq[start:]], device=t.device))
        outs = []
        for h in range(heads.n_heads):
            k = h + 1
            e = torch.zeros_like(emb)
            e[:, : T - k] = emb[:, k:]
            u = heads.head(h, e, u, torch.arange(T, device=t.device).unsqueeze(0))
            outs.append(u[0])
    return outs


def test_drafter_cache_matches_unrolled_training(tiny_llama):
    """The heads' committed outputs built incrementally at inference equal the unrolled training computation."""
    t = tiny_llama
    heads = _heads(t, 1)
    prompt = t.encode_prompt(PROMPT)
    dr = S4CDrafter(t, heads)
    toks, _ = run_to_end(t, prompt, dr, GenerationConfig(max_new_tokens=12))
    seq = prompt + toks[:-1]  # every position whose feature the drafter has seen
    for h, want in enumerate(_unrolled_heads(t, heads, seq)):
        n_ok = dr.cached_until[h]
        assert n_ok >= len(prompt) - (h + 1)
        torch.testing.assert_close(dr.head_outputs[h][:n_ok], want[:n_ok], atol=2e-3, rtol=1e-2)


def test_window_matches_training_crop_and_stays_lossless(tiny_llama):
    """With `window` W the heads see what training's prompt crop shows them: their outputs equal the unrolled heads
    run on the sequence from W tokens before the answer (positions renumbered from 0, as the trainer does), nothing
    before it enters their caches, and decoding stays token-identical to AR."""
    t = tiny_llama
    heads = _heads(t, 3)
    prompt = t.encode_prompt(PROMPT)
    W = 6
    assert len(prompt) > W + 3
    dr = S4CDrafter(t, heads, window=W)
    cfg = GenerationConfig(max_new_tokens=12)
    toks, _ = run_to_end(t, prompt, dr, cfg)
    assert toks == run_to_end(t, prompt, None, cfg)[0]
    start = len(prompt) - W
    for h, want in enumerate(_unrolled_heads(t, heads, prompt + toks[:-1], start)):
        n = dr.cached_until[h] - start
        assert dr.caches[h].get_seq_length() == n  # only positions from the window on
        torch.testing.assert_close(dr.head_outputs[h][start : dr.cached_until[h]], want[:n], atol=2e-3, rtol=1e-2)
        assert not dr.head_outputs[h][:start].any()


@pytest.mark.parametrize("kind", ["s4c", "chain", "eagle"])
def test_tree_invariants(tiny_llama, kind):
    t = tiny_llama
    dr = S4CDrafter(t, _heads(t), tree=kind, budget=12, topk=3)
    prompt = t.encode_prompt(PROMPT)
    _, events = run_to_end(t, prompt, dr, GenerationConfig(max_new_tokens=10))
    for e in events[:-1]:
        tree = e.tree
        assert len(tree) <= (12 if kind != "chain" else 3)
        depths = tree.depths()
        assert max(depths) <= 3
        assert all(p < i for i, p in enumerate(tree.parents))
        assert tree.sources == [f"head{d}" for d in depths]
        # siblings are distinct tokens
        seen = set()
        for tok, p in zip(tree.tokens, tree.parents):
            assert (p, tok) not in seen
            seen.add((p, tok))
        if kind == "chain":
            assert tree.parents == list(range(-1, len(tree) - 1))
        if kind == "s4c" and len(tree) >= 6 and max(depths) == 3:
            # vertical first: two chains of depth 3 hang off the two first depth-1 nodes
            kids = {}
            for i, p in enumerate(tree.parents):
                kids.setdefault(p, []).append(i)
            roots = kids[-1]
            assert len(roots) >= 2
            for r in roots[:2]:
                assert r in kids and any(c in kids for c in kids[r])
    assert len(dr.tally.conditional()) == 3


def test_draft_vocabulary_maps_to_target_ids_and_bounds_the_proposals(tiny_llama):
    """The heads score a draft vocabulary (a subset of the target's ids) plus the request's own tokens: every score
    row is the target's LM-head row of that id, and every head node proposes one of those ids, never an index into the
    draft vocabulary or an id outside it."""
    t = tiny_llama
    torch.manual_seed(0)
    heads = S4CHeads(t, 3, 96, torch.arange(2000, 2600)).eval().requires_grad_(False)  # ids far above the prompt's
    dr = S4CDrafter(t, heads, tree="s4c", budget=12, topk=3)
    prompt = t.encode_prompt(PROMPT)
    ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=12))
    out, events = run_to_end(t, prompt, dr, GenerationConfig(max_new_tokens=12))
    assert out == ref
    allowed = set(range(2000, 2600)) | set(prompt) | set(out)
    assert set(dr.vocab.tolist()) <= allowed and dr.vocab.max() < t.lm_head.weight.shape[0]
    torch.testing.assert_close(dr.heads.lm_weight(dr.vocab), t.lm_head.weight[dr.vocab])
    proposed = [tok for e in events if e.tree is not None for tok, src in zip(e.tree.tokens, e.tree.sources or [])
                if src.startswith("head")]
    assert proposed and set(proposed) <= allowed
    assert any(tok >= 2000 for tok in proposed)  # the draft vocabulary's ids themselves, not their indices 0..599


def test_draft_scores_pack_the_draft_vocabulary_once_and_the_prompts_other_tokens_per_request(tiny_llama):
    """A request's score columns are the heads' draft vocabulary, then the prompt's tokens outside it (each id once);
    each column is that id's LM-head row against the rows scored (bf16 rounding where the CPU packs in bf16), and the
    draft vocabulary's packed rows are one object across requests."""
    t = tiny_llama
    heads = S4CHeads(t, 3, 96, torch.arange(2000, 2600)).eval().requires_grad_(False)
    prompt = [5, 2100, 7, 5, 2599, 3000, 7]
    first, second = DraftScores(t, heads, prompt), DraftScores(t, heads, [9, 10])
    assert first.vocab.tolist() == list(range(2000, 2600)) + [5, 7, 3000]
    assert second.vocab.tolist() == list(range(2000, 2600)) + [9, 10]
    assert first.fixed is second.fixed
    rows = torch.randn(3, t.lm_head.weight.shape[1], generator=torch.Generator().manual_seed(0)).to(t.dtype)
    want = rows.float() @ t.lm_head.weight[first.vocab].float().T
    torch.testing.assert_close(first(rows).float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    alone = DraftScores(t, heads, [2000, 2001])  # every prompt token in the draft vocabulary: one product
    assert alone.extra is None and alone(rows).shape == (3, 600)


def test_losslessness_tiny(tiny):
    heads = _heads(tiny, 2)
    prompt = tiny.encode_prompt(PROMPT)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.9, top_p=0.95, seed=5)):
        cfg = GenerationConfig(max_new_tokens=24, sampling=sampling)
        ref, _ = run_to_end(tiny, prompt, None, cfg)
        for kind in ("s4c", "eagle"):
            got, _ = run_to_end(tiny, prompt, S4CDrafter(tiny, heads, tree=kind), cfg)
            assert got == ref


def test_training_loss_falls(tiny_llama, tmp_path):
    from specdemo.offline import train_s4c as s4c

    t = tiny_llama
    rng = torch.Generator().manual_seed(0)
    recs = []
    for i in range(6):  # a repetitive corpus the heads can learn quickly
        base = torch.randint(100, 400, (8,), generator=rng).tolist()
        recs.append({"id": f"r{i}", "prompt_ids": base[:4], "answer_ids": (base * 6)[:40]})
    data = tmp_path / "d.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"format": "specdemo-selfdistill"}) + "\n")
        for r in recs:
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "heads"
    args = types.SimpleNamespace(
        model=str(t.model.name_or_path), data=[str(data)], out=str(out), device=None, n_heads=3,
        intermediate_size=64, draft_vocab=512, steps=30, epochs=1, minutes=0, batch_size=3, lr=3e-3,
        weight_decay=0.0, warmup=2, noise=0.0, loss_weights=[0.1, 1.0, 1.0], max_prompt=16, max_len=64,
        heldout_max=0, seed=0, log_every=10, eval_every=1000, ckpt_every=15, resume=True,
        feature_cache=str(tmp_path / "fc"), threads=0, init=None, first=[0], feature_layers=[], new_vocab=False,
        feature_batch_tokens=4096, feature_part_records=256, head_inputs="own",
        autocast="none")
    records = s4c.read_records([str(data)])
    # --first: the first N records of each file (one number per file or one for all), 0 = all
    assert [r["id"] for r in s4c.read_records([str(data), str(data)], [2, 0])] == ["r0", "r1"] + [r["id"] for r in recs]
    assert len(s4c.read_records([str(data), str(data)], [1])) == 2
    with pytest.raises(ValueError, match="one per --data file"):
        s4c.read_records([str(data)], [1, 2])
    target = t
    feats = stored_features(target, records, tmp_path / "fc")
    heads = S4CHeads(target, 3, 64, s4c.build_draft_vocab(records, 512, target.lm_head.weight.shape[0], [0]))
    heads.train()
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    ids, ft, lens, starts = s4c.collate(records, feats, torch.float32, target.device)
    first = last = None
    for step in range(60):
        loss, ms = unrolled_losses(heads, ids, ft, lens, starts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = float(loss) if first is None else first
        last = float(loss)
    assert last < 0.7 * first
    # the CLI path: trains, checkpoints, writes an artifact, resumes
    assert s4c.train(args) == 0
    assert (out / "config.json").exists() and (out / "model.safetensors").exists() and (out / "checkpoint.pt").exists()
    args.steps = 33
    assert s4c.train(args) == 0
    assert "resumed from" in (out / "train_log.txt").read_text()
    with pytest.raises(ValueError, match="--feature-layers"):  # resumed with another shape: said, not ignored
        s4c.train(types.SimpleNamespace(**{**vars(args), "feature_layers": [1]}))
    loaded = load_heads(t, out)
    assert loaded.n_heads == 3 and json.loads((out / "config.json").read_text())["training"]["step"] == 33
    # --autocast bf16: the same run in bf16 autocast (fp32 weights and optimizer) learns about as much as in fp32
    for mode in ("none", "bf16"):
        assert s4c.train(types.SimpleNamespace(**{**vars(args), "out": str(tmp_path / mode), "autocast": mode})) == 0
    held = {m: s4c.evaluate(load_heads(t, tmp_path / m).float(), records, feats, args, t.device)["head1"]["soft_ce"]
            for m in ("none", "bf16")}
    start = s4c.evaluate(S4CHeads(target, 3, 64, load_heads(t, out).draft_vocab), records, feats, args,
                         t.device)["head1"]["soft_ce"]
    assert start - held["bf16"] > 0.6 * (start - held["none"]) > 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["training"]["autocast"] == "bf16"
    # warm start (--init): a new run starts from those heads, not from scratch
    # one (negligible) step: the exported heads are the initial ones
    warm = types.SimpleNamespace(**{**vars(args), "out": str(tmp_path / "warm"), "init": str(out), "steps": 1,
                                    "lr": 1e-9, "resume": False, "n_heads": 2, "intermediate_size": 32})
    held_first = lambda o: s4c.evaluate(load_heads(t, o), records, feats, args, t.device)["head1"]["soft_ce"]  # noqa: E731
    assert s4c.train(warm) == 0
    assert "initialised from" in (tmp_path / "warm" / "train_log.txt").read_text()
    assert abs(held_first(tmp_path / "warm") - held_first(out)) < 1e-3
    assert load_heads(t, tmp_path / "warm").n_heads == 3  # the architecture comes from the artifact
    # --new-vocab: the same weights over a draft vocabulary chosen afresh from the training records
    revocab = types.SimpleNamespace(**{**vars(warm), "out": str(tmp_path / "revocab"), "new_vocab": True,
                                       "draft_vocab": 24})
    assert s4c.train(revocab) == 0
    new, old = load_heads(t, tmp_path / "revocab"), load_heads(t, out)
    train_recs, _ = s4c.corpus.split_heldout(records)
    special = sorted(t.eos_ids) + list(t.tokenizer.all_special_ids)
    want = s4c.build_draft_vocab(train_recs, 24, t.lm_head.weight.shape[0], special)
    assert len(new.draft_vocab) == 24 < len(old.draft_vocab) and torch.equal(new.draft_vocab.cpu(), want.cpu())
    assert torch.equal(new.fc[0].weight, old.fc[0].weight)
    # --init of last-layer heads with --feature-layers: the fused heads start as those heads (the projection passes
    # the last layer through), so they draft what the initial heads draft
    fused = types.SimpleNamespace(**{**vars(warm), "out": str(tmp_path / "fused"), "feature_layers": [1],
                                     "feature_cache": str(tmp_path / "fc1")})
    assert s4c.train(fused) == 0
    f = load_heads(t, tmp_path / "fused")
    assert f.feature_layers == (1,) and torch.equal(f.fc[0].weight, old.fc[0].weight)
    d = f.d
    assert torch.allclose(f.fuse.weight[:, -d:].float().cpu(), torch.eye(d), atol=1e-3)
    assert f.fuse.weight[:, :-d].abs().max() < 1e-3
    # --init with more --n-heads: the trained heads keep their weights, the deeper ones start as the deepest of them
    deep = types.SimpleNamespace(**{**vars(warm), "out": str(tmp_path / "deep"), "n_heads": 5})
    assert s4c.train(deep) == 0
    five = load_heads(t, tmp_path / "deep")
    assert five.n_heads == 5
    assert "heads 4..5 start as copies of head 3" in (tmp_path / "deep" / "train_log.txt").read_text()
    assert torch.equal(five.fc[0].weight, old.fc[0].weight)
    for h in (3, 4):
        for a, b in zip(five.layers[h].parameters(), old.layers[2].parameters()):
            assert torch.equal(a, b)
    prompt, cfg = t.encode_prompt(PROMPT), GenerationConfig(max_new_tokens=12)
    dr = S4CDrafter(t, five.eval(), budget=20)
    assert run_to_end(t, prompt, dr, cfg)[0] == run_to_end(t, prompt, None, cfg)[0]
    assert dr.tally.reached[4] > 0  # the fifth head drafted


def test_training_time_test_feeds_each_head_the_previous_heads_output(tiny_llama, tmp_path):
    """Training-time test (the default): head 2's input is head 1's output and head 3's is head 2's, as when
    drafting, so head 2's loss trains head 1 too.  Teacher forcing (`head_inputs="target"`, the ablation) feeds
    each head the target feature the previous head imitates instead, and head 1 learns from its own loss alone."""
    from specdemo.offline import train_s4c as s4c

    t = tiny_llama
    torch.manual_seed(0)
    records = [{"id": f"r{i}", "ids": torch.randint(100, 400, (30,)).tolist(), "start": 5} for i in range(3)]
    ids, ft, lens, starts = s4c.collate(records, stored_features(t, records, tmp_path / "f"), torch.float32, t.device)
    heads = S4CHeads(t, 3, 64, s4c.build_draft_vocab(records, 512, t.lm_head.weight.shape[0], [0]))
    calls, head = [], heads.head

    def spy(h, emb, u, pos, *args, **kwargs):
        out = head(h, emb, u, pos, *args, **kwargs)
        calls.append((u, out))
        return out

    heads.head = spy
    T = ids.shape[1]
    grads = {}
    for mode in ("own", "target"):
        calls.clear()
        heads.zero_grad(set_to_none=True)
        loss, _ = unrolled_losses(heads, ids, ft, lens, starts, head_weights=(0.0, 1.0, 0.0), head_inputs=mode)
        loss.backward()
        assert torch.equal(calls[0][0], ft)
        if mode == "own":
            assert calls[1][0] is calls[0][1] and calls[2][0] is calls[1][1]
        else:
            for h in (1, 2):
                assert torch.equal(calls[h][0][:, : T - h], ft[:, h:]) and not calls[h][0][:, T - h :].any()
        grads[mode] = heads.layers[0].mlp.down_proj.weight.grad
    assert grads["own"] is not None and grads["own"].abs().max() > 0
    assert grads["target"] is None or not grads["target"].any()
    with pytest.raises(ValueError, match="'own' or 'target'"):
        unrolled_losses(heads, ids, ft, lens, starts, head_inputs="teacher")


def test_held_out_hits_against_the_whole_vocabulary(tiny_llama, tmp_path):
    """`top1_full` counts a hit only where the drafted token is the target's choice over its whole vocabulary: equal
    to `top1` when the heads score every token, and lower when the draft vocabulary leaves out tokens the target
    chooses (the within-vocabulary label never misses those)."""
    from specdemo.offline import train_s4c as s4c
    from specdemo.offline.s4c_metrics import format_metrics, sum_metrics

    t = tiny_llama
    torch.manual_seed(0)
    records = [{"id": f"r{i}", "ids": torch.randint(100, 400, (40,)).tolist(), "start": 6} for i in range(4)]
    feats = stored_features(t, records, tmp_path / "f")
    ids, ft, lens, starts = s4c.collate(records, feats, torch.float32, t.device)
    whole = S4CHeads(t, 3, 64, torch.arange(t.lm_head.weight.shape[0]))
    with torch.no_grad():
        full_labels = (ft[..., -whole.d:] @ t.lm_head.weight.T).argmax(-1).unique()
    few = S4CHeads(t, 3, 64, torch.tensor(sorted(set(range(0, 1000)) - set(full_labels.tolist()))[:200]))
    few.load_state_dict({k: v for k, v in whole.state_dict().items() if k != "draft_vocab"}, strict=False)
    m_whole, m_few = (format_metrics(sum_metrics([], unrolled_losses(h, ids, ft, lens, starts, full_vocab=True)[1]))
                      for h in (whole, few))
    for h in m_whole:
        assert m_whole[h]["top1_full"] == m_whole[h]["top1"] and m_whole[h]["chain_full"] == m_whole[h]["chain"]
        assert m_few[h]["top1_full"] == 0 < m_few[h]["top1"]  # no target choice is in this vocabulary


def test_artifact_round_trip_and_refusal(tiny, tiny_llama, tmp_path):
    heads = _heads(tiny_llama)
    save_heads(heads, tmp_path / "h")
    assert (tmp_path / "h" / "model.safetensors").stat().st_size < 20 * 2 ** 20
    back = load_heads(tiny_llama, tmp_path / "h")
    for (k, a), (_, b) in zip(heads.state_dict().items(), back.state_dict().items()):
        assert torch.allclose(a.float(), b.float(), atol=1e-2), k  # fp16 storage
    assert torch.equal(back.draft_vocab, heads.draft_vocab)
    dr = make_drafter("s4c", tiny_llama, heads=str(tmp_path / "h"))
    assert isinstance(dr, S4CDrafter)
    if tiny.model.config.model_type != "llama":  # another model: refused with the command that fixes it
        with pytest.raises(S4CArtifactError, match="another model"):
            load_heads(tiny, tmp_path / "h")
        with pytest.raises(DrafterUnavailable, match="train s4c"):
            make_drafter("s4c", tiny, heads=str(tmp_path / "h"))
    with pytest.raises(DrafterUnavailable, match="train s4c"):
        make_drafter("s4c", tiny)  # no default heads for a non-embedded model
    assert "train s4c" in unavailable_reason("s4c", tiny)
    with pytest.raises(DrafterUnavailable, match="hub|not found"):
        make_drafter("s4c", tiny_llama, heads="nobody-here/no-such-heads")
    with pytest.raises(ValueError):
        make_drafter("s4c", tiny_llama, heads=str(tmp_path / "h"), tree="bogus")


def test_embedded_shipped_heads_lossless(embedded):
    assert (EMBEDDED_HEADS / "model.safetensors").exists(), "the shipped heads are missing"
    prompt = embedded.encode_prompt("Write a Python function that returns the sum of a list of numbers.")
    assert unavailable_reason("s4c", embedded) is None
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9, seed=1)):
        cfg = GenerationConfig(max_new_tokens=40, sampling=sampling)
        ref, _ = run_to_end(embedded, prompt, None, cfg)
        dr = make_drafter("s4c", embedded)
        got, events = run_to_end(embedded, prompt, dr, cfg)
        assert got == ref
        if sampling.greedy:
            assert len(got) / len(events) > 1.2  # trained heads do accept drafts


def test_prompt_lookup_graft_lossless_and_budget(tiny_llama):
    t = tiny_llama
    heads = _heads(t, 3)
    prompt = t.encode_prompt("repeat: one two three four one two three four one two")
    cfg = GenerationConfig(max_new_tokens=20)
    ref, _ = run_to_end(t, prompt, None, cfg)
    got, events = run_to_end(t, prompt, S4CDrafter(t, heads, budget=12, prompt_lookup=5), cfg)
    assert got == ref
    assert all(e.tree_size <= 12 for e in events)


def stored_features(target, records: list[dict], folder, layers: tuple[int, ...] = ()) -> FeatureStore:
    """The records' features in a store of 16-token prompts and 64-token windows."""
    store = FeatureStore(folder, 16, 64)
    extract(target, records, store, layers, log=lambda m: None)
    return store


def _train_args(model: str, data, out, fc) -> list[str]:
    return ["train", "s4c", "--model", model, "--data", str(data), "--out", str(out), "--intermediate-size", "64",
            "--draft-vocab", "512", "--steps", "2", "--batch-size", "5", "--lr", "3e-3", "--warmup", "2",
            "--max-prompt", "16", "--max-len", "64", "--heldout-max", "0", "--log-every", "2", "--ckpt-every", "100",
            "--feature-cache", str(fc), "--feature-part-records", "4", "--device", "cpu"]


@pytest.mark.slow
def test_accelerate_launch_with_two_processes_trains_the_heads_one_process_trains(tiny_llama, tmp_path):
    """Data parallelism: each process takes every other sequence of the same global batch (of 5: shares of 3 and 2,
    with different numbers of loss positions), the loss terms are normalised by the global batch's counts and the
    gradients summed, so two processes take one process's optimizer steps (to float round-off)."""
    import os
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file

    from specdemo import cli
    from specdemo.offline import s4c_data

    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("accelerate's launcher is not installed")
    rng = torch.Generator().manual_seed(1)
    data = tmp_path / "d.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"format": "specdemo-selfdistill"}) + "\n")
        for i in range(12):
            ids = torch.randint(100, 400, (int(torch.randint(12, 40, (1,), generator=rng)),), generator=rng).tolist()
            f.write(json.dumps({"id": f"r{i}", "prompt_ids": ids[:5], "answer_ids": ids[5:]}) + "\n")
    model = str(tiny_llama.model.name_or_path)
    assert cli.main(_train_args(model, data, tmp_path / "one", tmp_path / "fc")) == 0
    env = cpu_processes_env()
    # --multi_gpu: accelerate's torchrun launcher, CPU processes (gloo) with CUDA hidden
    done = subprocess.run([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29519",
                           "-m", "specdemo", *_train_args(model, data, tmp_path / "two", tmp_path / "fc2")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "data parallel over 2 processes" in (tmp_path / "two" / "train_log.txt").read_text()
    # the processes shared the features' parts out (3 parts of 4 records) and stored what one process stores
    (one_store,), (two_store,) = (list(fc.iterdir()) for fc in (tmp_path / "fc", tmp_path / "fc2"))
    assert len(list(two_store.glob("part-*.safetensors"))) == 3
    one_feats, two_feats = FeatureStore(one_store, 16, 64), FeatureStore(two_store, 16, 64)
    assert one_feats.index.keys() == two_feats.index.keys() and len(one_feats) >= 9
    records = s4c_data.read_records([str(data)])
    assert all(torch.equal(one_feats.window(r), two_feats.window(r)) for r in records if r in one_feats)
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=False)["model"]  # fp32, unlike the artifact
    two = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)["model"]
    assert one.keys() == two.keys() and load_file(tmp_path / "two" / "model.safetensors").keys()
    start = S4CHeads(tiny_llama, 3, 64).state_dict()  # fc starts as [0 | I] whatever the seed
    moved = max(float((one[k] - start[k].cpu()).abs().max()) for k in one if k.startswith("fc."))
    assert moved > 2e-3  # training moved the weights far more than the two runs may differ
    # two steps: Adam's first step is lr * sign(g) and would hide a gradient of the wrong size; later steps amplify the
    # processes' different summation order (~1e-6 after one step, ~1e-5 after two, ~1e-3 after six)
    for k in one:
        assert torch.allclose(one[k], two[k], rtol=0, atol=1e-4), k


def test_fused_feature_heads_train_save_and_draft_losslessly(tiny_llama, tmp_path):
    """EAGLE-3-style fused features: head 1 reads a projection of a declared layer's state and the last hidden state
    side by side.  It starts as the plain heads (the projection passes the last state through), trains on the wide
    features, keeps its layers through save and load, and the drafter it makes declares them to the engine, gets
    the wide features and drafts losslessly."""
    from specdemo.offline import train_s4c as s4c

    t, d = tiny_llama, tiny_llama.model.config.hidden_size
    rng = torch.Generator().manual_seed(0)
    records = []
    for i in range(6):
        base = torch.randint(100, 400, (8,), generator=rng).tolist()
        records.append({"id": f"r{i}", "ids": base[:4] + (base * 6)[:40], "start": 4})
    feats = stored_features(t, records, tmp_path / "f", layers=(1,))
    assert feats.window(records[0]).shape[-1] == 2 * d
    vocab = s4c.build_draft_vocab(records, 512, t.lm_head.weight.shape[0], [0])
    plain, fused = S4CHeads(t, 3, 64, vocab), S4CHeads(t, 3, 64, vocab, feature_layers=(1,))
    fused.load_state_dict(plain.state_dict(), strict=False)
    ids, ft, lens, starts = s4c.collate(records, feats, torch.float32, t.device)
    with torch.no_grad():  # the fresh projection passes the last hidden state through
        torch.testing.assert_close(unrolled_losses(fused, ids, ft, lens, starts)[0],
                                   unrolled_losses(plain, ids, ft[..., -d:], lens, starts)[0])
    opt = torch.optim.AdamW(fused.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss, _ = unrolled_losses(fused, ids, ft, lens, starts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < 0.7 * first
    save_heads(fused, tmp_path / "h")
    back = load_heads(t, tmp_path / "h")
    assert back.feature_layers == (1,) and torch.allclose(back.fuse.weight.float(), fused.fuse.weight, atol=1e-2)
    drafter = make_drafter("s4c", t, heads=str(tmp_path / "h"), dynamic=False)
    assert drafter.feature_layers == (1,)
    prompt = t.encode_prompt("The first features of a tree")
    ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=24))
    out, _ = run_to_end(t, prompt, drafter, GenerationConfig(max_new_tokens=24))
    assert out == ref and drafter.features.shape[-1] == 2 * d


def test_fused_draft_step_equals_the_heads_forward(tiny):
    """`draft_step.DraftStep.head` (fused q/k/v and gate/up products, one rotary table, torch's rms_norm) gives what
    `S4CHeads.head` gives: a committed chain into the cache, then a two-branch draft call with a tree mask over it."""
    from specdemo.drafters.s4c.draft_step import DraftStep, supported
    from specdemo.kvcache import KVCache
    from specdemo.tree import additive_mask, ancestor_mask

    heads = _heads(tiny, 4)
    assert supported(heads)
    step = DraftStep(heads, 64)
    d = tiny.model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    for h in range(heads.n_heads):
        caches = [KVCache(32), KVCache(32)]
        for rows, past in ((5, 0), (4, 5)):  # 5 committed rows (a causal chain), then 4 draft rows as a tree
            parents = list(range(-1, rows - 1)) if past == 0 else [-1, 0, -1, 2]
            mask = additive_mask(ancestor_mask(parents), past, torch.float32).to(tiny.device)
            emb = torch.randn(1, rows, d, generator=g).to(tiny.device)
            feat = torch.randn(1, rows, d * (len(heads.feature_layers) + 1), generator=g).to(tiny.device)
            pos = torch.arange(past, past + rows, device=tiny.device).unsqueeze(0)
            want = heads.head(h, emb, feat, pos, mask=mask, cache=caches[0])
            got = step.head(h, emb, feat, pos, mask, caches[1])
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_heads_cut_to_a_smaller_shape_keep_their_channels_exactly(tiny_llama):
    """scripts/head_shape_cost.py's smaller heads (which price a head shape's drafting) keep the kept MLP channels'
    weights as they were: each cut head computes what the original computes with the dropped channels zeroed, and
    scores only the vocabulary it was given."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "head_shape_cost.py"
    spec = importlib.util.spec_from_file_location("head_shape_cost", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    t = tiny_llama
    heads = _heads(t)
    small = script.cut_heads(heads, 32, torch.arange(100, 300)).eval().requires_grad_(False)
    assert small.intermediate_size == 32 and small.draft_vocab.tolist() == list(range(100, 300))
    zeroed = S4CHeads(t, 3, 96, torch.arange(3000)).eval().requires_grad_(False)
    zeroed.load_state_dict(heads.state_dict())
    torch.manual_seed(1)
    emb, feat = torch.randn(1, 5, heads.d), torch.randn(1, 5, heads.d)
    pos = torch.arange(5).unsqueeze(0)
    for h, layer in enumerate(zeroed.layers):
        dropped = script.channel_order(heads.layers[h])[32:]
        layer.mlp.down_proj.weight[:, dropped] = 0
        torch.testing.assert_close(small.head(h, emb, feat, pos), zeroed.head(h, emb, feat, pos), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(heads.head(h, emb, feat, pos), zeroed.head(h, emb, feat, pos))
