"""SDSAT: probe-only adapter (masking, training loss), artifact round trip / refusal, losslessness (greedy, sampling)."""
from __future__ import annotations

import contextlib

import gzip
import json
import random

import pytest
import torch

from conftest import cpu_processes_env, on_cpu
from specdemo.drafters import DrafterUnavailable, make_drafter
from specdemo.drafters.sdsat.adapter import (
    AdapterError,
    SDSATAdapter,
    default_artifact_dir,
    load_adapter,
)
from specdemo.drafters.sdsat.drafter import SDSATDrafter
from specdemo.drafters.sdsat.probe_cost import PRIOR_STEPS, PRIOR_YIELD, ProbePricing
from specdemo.engine import GenerationConfig, run_to_end
from specdemo.verify import tree_forward
from specdemo.kvcache import KVCache
from specdemo.offline.corpus import read_records
from specdemo.offline.sdsat_probes import build_probes, probe_logits, probe_logits_and_targets
from specdemo.offline.train_sdsat import TrainConfig, evaluate, train
from specdemo.sampling import SamplingConfig
from specdemo.tree import DraftTree, TreeBuffers

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
]


def _noisy_adapter(target, seed: int = 0, std: float = 0.5) -> SDSATAdapter:
    """An untrained adapter with NON-zero LoRA B and a random embedding, so any leak into standard rows would show."""
    ad = SDSATAdapter(target.model, rank=4, alpha=8, token_id=3, init_seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k in ad.lora_B:
            ad.lora_B[k].copy_(torch.randn(ad.lora_B[k].shape, generator=g) * std)
        ad.embedding.copy_(torch.randn(ad.embedding.shape, generator=g))
    ad.requires_grad_(False)
    return ad


# ---------------------------------------------------------------- masking: standard rows are the original model's

def _train_steps(t, ad, seq, prompt_len, lr, steps, rate, max_probes, L=3):
    """A few AdamW steps of the adaptive-position CE on one sequence (seeded)."""
    opt = torch.optim.AdamW(ad.parameters(), lr=lr)
    rng = random.Random(0)
    for _ in range(steps):
        b = build_probes(seq, prompt_len, L, rate, rng, max_probes, L)
        logits = probe_logits(t.model, ad, seq, b, grad=True)
        loss = torch.nn.functional.cross_entropy(logits, b[2].to(logits.device))
        opt.zero_grad()
        loss.backward()
        opt.step()

def test_standard_positions_untouched_by_adapter(tiny):
    """Standard rows (and their KV entries) are the plain model's bit for bit, through the CPU's probe-row hooks and
    through the graph-safe ones CUDA uses (every row, probe rows from static masks), whose probe rows match."""
    ad = _noisy_adapter(tiny)
    torch.manual_seed(3)
    ctx = torch.randint(100, 5000, (10,)).tolist()
    # root -> a -> b, with probe chains under root and under a; and a side branch c
    tree = DraftTree(tokens=[11, 22, 3, 3, 3, 3, 33], parents=[-1, 0, -1, 2, 0, 4, -1],
                     probe=[False, False, True, True, True, True, False])
    buf = TreeBuffers.build(tree, len(ctx) - 1, tiny.device)
    drafter = SDSATDrafter(tiny, ad, k=2)
    outs = {}
    for mode in ("plain", "adapter", "masked"):
        cache = KVCache(capacity=32)
        drafter.masked_rows = mode == "masked"
        with torch.no_grad():
            tiny.decoder(input_ids=torch.tensor([ctx[:-1]], device=tiny.device), past_key_values=cache,
                         use_cache=True)
            with drafter.verify_context(tree, buf) if mode != "plain" else contextlib.nullcontext():
                h = tree_forward(tiny, cache, ctx[-1:] + tree.tokens, buf)
        outs[mode] = (h, [layer.keys.clone() for layer in cache.layers])
    std_rows = [0] + [i + 1 for i in range(len(tree)) if not tree.is_probe(i)]
    probe_rows = [i + 1 for i in range(len(tree)) if tree.is_probe(i)]
    past = len(ctx) - 1
    for mode in ("adapter", "masked"):
        assert torch.equal(outs["plain"][0][std_rows], outs[mode][0][std_rows])  # bit-identical
        assert not torch.allclose(outs["plain"][0][probe_rows], outs[mode][0][probe_rows])  # the adapter is live
        for k_plain, k_ad in zip(outs["plain"][1], outs[mode][1]):
            assert torch.equal(k_plain[:, :, : past + 1], k_ad[:, :, : past + 1])
            assert torch.equal(k_plain[:, :, [past + r for r in std_rows]], k_ad[:, :, [past + r for r in std_rows]])
    assert torch.allclose(outs["adapter"][0][probe_rows], outs["masked"][0][probe_rows], atol=1e-4, rtol=1e-4)
    drafter.masked_rows = False
    # hooks are gone after the block: a plain model forward equals the reference
    x = torch.tensor([ctx], device=tiny.device)
    with torch.no_grad():
        a = tiny.model(input_ids=x).logits
        with drafter.verify_context(DraftTree.empty(), TreeBuffers.build(DraftTree.empty(), 0, tiny.device)):
            pass
        b = tiny.model(input_ids=x).logits
    assert torch.equal(a, b)


def test_training_forward_matches_inference_probes(tiny_llama):
    """The training path (clean KV + masked adaptive chains) gives the same probe logits as the engine's tree."""
    ad = _noisy_adapter(tiny_llama, seed=1)
    torch.manual_seed(4)
    seq = torch.randint(100, 5000, (14,)).tolist()
    p, k = 8, 3  # chain after x_0..x_8
    batch = build_probes(seq, p + 1, k, 1.0, None, k, 3)
    got = probe_logits(tiny_llama.model, ad, seq, batch, grad=False)[:k]
    tree = DraftTree(tokens=[3] * k, parents=[-1, 0, 1], probe=[True] * k)
    buf = TreeBuffers.build(tree, p, tiny_llama.device)
    cache = KVCache(capacity=32)
    drafter = SDSATDrafter(tiny_llama, ad, k=k)
    with torch.no_grad():
        tiny_llama.decoder(input_ids=torch.tensor([seq[:p]], device=tiny_llama.device), past_key_values=cache,
                           use_cache=True)
        with drafter.verify_context(tree, buf):
            h = tree_forward(tiny_llama, cache, [seq[p]] + tree.tokens, buf)
        want = tiny_llama.lm_head(h[1:])
    assert batch[2].tolist() == seq[p + 2 : p + 2 + k]  # labels: the original next tokens after each slot
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_soft_targets_are_the_original_models_next_token_distributions(tiny_llama):
    """The soft labels of every chain row are the frozen model's own distribution at the label's position (a full
    forward over the clean sequence gives the same), the chains' logits do not change with the longer clean context
    it takes, and a weight outside 0..1 is refused with the range."""
    ad = _noisy_adapter(tiny_llama, seed=2)
    torch.manual_seed(5)
    seq = torch.randint(100, 5000, (20,)).tolist()
    batch = build_probes(seq, 6, 4, 1.0, None, 40, 3)
    logits, soft = probe_logits_and_targets(tiny_llama.model, ad, seq, batch, grad=False, soft=True)
    with torch.no_grad():
        full = tiny_llama.model(input_ids=torch.tensor([seq], device=tiny_llama.device)).logits[0].float().softmax(-1)
    pos, labels = batch[1], batch[2]
    torch.testing.assert_close(soft, full[pos], rtol=1e-4, atol=1e-6)
    assert torch.equal(torch.tensor(seq)[pos + 1], labels)  # each row's label is the token after its position
    torch.testing.assert_close(logits, probe_logits(tiny_llama.model, ad, seq, batch, grad=False), rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(ValueError, match="0..1"):
        train(TrainConfig(soft_weight=1.5))


def test_soft_label_training_moves_the_chains_toward_the_models_distribution(tiny_llama):
    """`--soft-weight 1`: the trainer's own sequence loss lowers the CE of the chains against the original model's
    distribution."""
    from specdemo.offline.train_sdsat import _chains_loss, _draw_chains

    t = tiny_llama
    prompt = t.encode_prompt(PROMPTS[0])
    ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=30))
    seq, rec = prompt + ref, {"id": "x", "prompt_ids": prompt, "answer_ids": ref}
    ad = SDSATAdapter(t.model, rank=4, alpha=8, token_id=3)
    cfg = TrainConfig(soft_weight=1.0, L=3, rate=0.5, max_probes=120, seqs_per_step=1)

    def soft_ce() -> float:
        b = build_probes(seq, len(prompt), 3, 1.0, None, 120, 3)
        logits, soft = probe_logits_and_targets(t.model, ad, seq, b, grad=False, soft=True)
        return float(-(soft * logits.float().log_softmax(-1)).sum(-1).mean())

    before, opt, rng = soft_ce(), torch.optim.AdamW(ad.parameters(), lr=1e-2), random.Random(0)
    for _ in range(12):
        opt.zero_grad()
        _chains_loss(t.model, ad, cfg, [(rec, _draw_chains(cfg, rec, rng, ad.token_id))])
        opt.step()
    assert soft_ce() < 0.8 * before


@pytest.mark.parametrize("soft", [False, True])
def test_chains_of_several_sequences_in_one_forward_equal_one_sequence_at_a_time(tiny_llama, soft):
    """Sequences of different lengths and chain counts batched (clean contexts padded on the right, padding chain
    rows): every sequence's logits and soft labels, the step's gradients and the held-out numbers equal those of one
    sequence per forward, to float round-off; a batch below 1 is refused with its range."""
    from specdemo.offline.sdsat_probes import probe_logits_many
    from specdemo.offline.train_sdsat import _chains_loss

    t = tiny_llama
    ad = _noisy_adapter(t, seed=3, std=0.05)
    ad.requires_grad_(True)
    g = torch.Generator().manual_seed(6)
    recs = []
    for n_prompt, n_answer in ((5, 9), (11, 23), (3, 4)):
        ids = torch.randint(100, 5000, (n_prompt + n_answer,), generator=g).tolist()
        recs.append({"id": f"r{n_prompt}", "prompt_ids": ids[:n_prompt], "answer_ids": ids[n_prompt:]})
    seqs = [r["prompt_ids"] + r["answer_ids"] for r in recs]
    rng = random.Random(1)
    chains = [build_probes(s, len(r["prompt_ids"]), 3, 0.6, rng, 40, ad.token_id) for s, r in zip(seqs, recs)]
    assert len({len(b[0]) for b in chains}) == 3  # three different chain counts: padding rows are exercised
    many = probe_logits_many(t.model, ad, seqs, chains, grad=False, soft=soft)
    for s, b, (logits, targets) in zip(seqs, chains, many):
        one, one_targets = probe_logits_and_targets(t.model, ad, s, b, grad=False, soft=soft)
        torch.testing.assert_close(logits, one, rtol=1e-4, atol=1e-4)
        if soft:
            torch.testing.assert_close(targets, one_targets, rtol=1e-4, atol=1e-6)
    cfg = TrainConfig(L=3, seqs_per_step=3, soft_weight=0.5 if soft else 0.0)
    drawn = list(zip(recs, chains))

    def grads(groups):
        ad.zero_grad(set_to_none=True)
        losses = [x for part in groups for x in _chains_loss(t.model, ad, cfg, part)]
        return losses, {k: p.grad.clone() for k, p in ad.named_parameters()}

    losses_one, grads_one = grads([[d] for d in drawn])
    losses_all, grads_all = grads([drawn])
    assert losses_all == pytest.approx(losses_one, rel=1e-4)
    for k in grads_one:
        torch.testing.assert_close(grads_all[k], grads_one[k], rtol=1e-3, atol=1e-6)
    together, apart = evaluate(t.model, ad, recs, 3, batch=3), evaluate(t.model, ad, recs, 3)
    assert together["loss"] == pytest.approx(apart["loss"], rel=1e-4)
    assert {k: v for k, v in together.items() if k != "loss"} == {k: v for k, v in apart.items() if k != "loss"}
    with pytest.raises(ValueError, match="at least 1"):
        train(TrainConfig(batch=0))


def test_training_steps_reduce_adaptive_loss(tiny_llama):
    t = tiny_llama
    prompt = t.encode_prompt(PROMPTS[0])
    ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=30))
    seq = prompt + ref
    ad = SDSATAdapter(t.model, rank=4, alpha=8, token_id=3)
    rec = [{"id": "x", "prompt_ids": prompt, "answer_ids": ref}]
    before = evaluate(t.model, ad, rec, 3)
    _train_steps(t, ad, seq, len(prompt), lr=1e-2, steps=12, rate=0.5, max_probes=120)
    after = evaluate(t.model, ad, rec, 3)
    assert after["loss"] < 0.7 * before["loss"]
    # the base model itself never received a gradient and is unchanged outside the adapter's block
    assert all(p.grad is None for p in t.model.parameters())
    out, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=30))
    assert out == ref


def test_train_cli_checkpoint_resume_and_artifact(tiny_llama, tmp_path):
    t = tiny_llama
    recs = []
    for i, text in enumerate(PROMPTS * 3):
        prompt = t.encode_prompt(text + " " * i)
        ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=20))
        recs.append({"id": ("h72", "h146")[i] if i < 2 else f"r{i}", "prompt_ids": prompt, "answer_ids": ref})
    data = tmp_path / "corpus.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"format": "specdemo-selfdistill"}) + "\n")
        for r in recs:
            f.write(json.dumps(r) + "\n")
    assert len(read_records([data])) == len(recs)
    model_dir = t.model.config._name_or_path
    # "h72" and "h146" fall in the shared held-out split (sharegpt.is_heldout_record)
    cfg = TrainConfig(model=model_dir, data=[str(data)], out=str(tmp_path / "out"), L=3, rank=2, alpha=4, steps=4,
                      warmup=1, seqs_per_step=1, eval_every=2, ckpt_every=2, heldout_max=2)
    logs = []
    r1 = train(cfg, log=logs.append)
    assert r1["step"] == 4 and (tmp_path / "out" / "checkpoint.pt").exists()
    cfg.steps = 6
    r2 = train(cfg, resume=True, log=logs.append)
    assert r2["step"] == 6 and any("resumed" in m for m in logs)
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "sdsat_embedding.safetensors",
            "sdsat_config.json"} <= files
    ad, meta = load_adapter(tmp_path / "out", t)
    assert meta["L"] == 3 and meta["train"]["step"] == 6
    # warm start (--init): a new run starts from that adapter; with lr 0 it exports the same weights
    warm = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "warm"), "init": str(tmp_path / "out"), "steps": 1,
                          "lr": 0.0, "heldout_max": 0})
    train(warm, log=logs.append)
    assert any("initialised from" in m for m in logs)
    ad2, _ = load_adapter(tmp_path / "warm", t)
    assert all(torch.equal(a, b) for a, b in zip(ad.state_dict().values(), ad2.state_dict().values()))
    # ... or from a subset of its targets (fewer LoRA modules = cheaper probe rows); a target it lacks starts fresh
    sub = TrainConfig(**{**warm.__dict__, "out": str(tmp_path / "sub"), "targets": ["gate_proj", "up_proj"]})
    train(sub, log=logs.append)
    ad3, meta3 = load_adapter(tmp_path / "sub", t)
    assert meta3["targets"] == ["gate_proj", "up_proj"] and len(ad3._mods) == 2 * t.model.config.num_hidden_layers
    full = ad.state_dict()
    assert all(torch.equal(v, full[k]) for k, v in ad3.state_dict().items())
    grown = TrainConfig(**{**sub.__dict__, "out": str(tmp_path / "grown"), "init": str(tmp_path / "sub"),
                           "targets": ["q_proj", "gate_proj"]})
    train(grown, log=logs.append)
    assert any("q_proj start fresh" in m for m in logs)
    ad4, _ = load_adapter(tmp_path / "grown", t)
    sub_state = ad3.state_dict()
    for k, v in ad4.state_dict().items():
        if "q_proj" in k and "lora_B" in k:
            assert not v.any()  # a fresh B: the grown adapter predicts what the one it started from predicts
        elif k in sub_state:
            assert torch.equal(v, sub_state[k])
    with pytest.raises(ValueError, match="differ from this run's"):
        train(TrainConfig(**{**grown.__dict__, "out": str(tmp_path / "bad"), "rank": 4}), log=logs.append)


# ---------------------------------------------------------------- artifact round trip and refusal
def test_artifact_round_trip_and_refusal(tiny, tiny_llama, tmp_path):
    ad = _noisy_adapter(tiny)
    ad.save(tmp_path / "a", tiny.identity, tiny.model, dtype=torch.float32)
    back, cfg = load_adapter(tmp_path / "a", tiny)
    for k in ad.lora_A:
        assert torch.equal(ad.lora_A[k], back.lora_A[k]) and torch.equal(ad.lora_B[k], back.lora_B[k])
    assert torch.equal(ad.embedding, back.embedding) and back.token_id == ad.token_id
    size = sum(p.stat().st_size for p in (tmp_path / "a").iterdir())
    assert size < 20e6
    peft_cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert peft_cfg["peft_type"] == "LORA" and peft_cfg["r"] == 4
    if tiny.model.config.model_type != "llama":  # Qwen2 vs Llama: another base config -> refused, with the command that fixes it
        with pytest.raises(AdapterError, match="another model"):
            load_adapter(tmp_path / "a", tiny_llama)
        with pytest.raises(DrafterUnavailable, match="train sdsat"):
            make_drafter("sdsat", tiny_llama, adapter=str(tmp_path / "a"))
    with pytest.raises(AdapterError, match="not a local folder"):
        load_adapter("nobody-xyz/no-such-sdsat-adapter", tiny)  # HF_HUB_OFFLINE=1 in conftest
    with pytest.raises(AdapterError):
        load_adapter(tmp_path / "missing", tiny)


def test_peft_can_load_the_adapter(tiny_llama, tmp_path):
    """The LoRA part is a standard peft adapter: peft applied to ALL positions equals our hook at all positions."""
    peft = pytest.importorskip("peft")
    ad = _noisy_adapter(tiny_llama, std=0.05)
    ad.save(tmp_path / "a", tiny_llama.identity, tiny_llama.model, dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8]], device=tiny_llama.device)
    with torch.no_grad():
        base = tiny_llama.model.get_decoder()
        with ad.active(None):
            ours = base(inputs_embeds=base.get_input_embeddings()(ids) * 0 + 0.1).last_hidden_state
        from transformers import AutoModelForCausalLM

        fresh = AutoModelForCausalLM.from_pretrained(tiny_llama.model.config._name_or_path)
        pm = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "a"))
        theirs = pm.base_model.model.get_decoder()(
            inputs_embeds=torch.full((1, 4, ad.embedding.numel()), 0.1)).last_hidden_state
    torch.testing.assert_close(ours.cpu(), theirs, rtol=1e-4, atol=1e-4)  # peft's model loads on the CPU


# ---------------------------------------------------------------- losslessness
@pytest.mark.parametrize("loop,branching,prompt_lookup,shape", [("fused", None, 0, "uniform"), ("fused", "2,2,1", 4, "uniform"),
                                                         ("paper", "3,1,1", 0, "uniform"), ("fused", "6,2", 0, "main"),
                                                         ("fused", "4,1", 0, "fan")])
def test_greedy_lossless_tiny(tiny, loop, branching, prompt_lookup, shape):
    ad = _noisy_adapter(tiny)
    cfg = GenerationConfig(max_new_tokens=40)
    for text in PROMPTS[:1]:
        prompt = tiny.encode_prompt(text)
        ref, _ = run_to_end(tiny, prompt, None, cfg)
        d = SDSATDrafter(tiny, ad, k=3, loop=loop, branching=branching, prompt_lookup=prompt_lookup, shape=shape)
        out, events = run_to_end(tiny, prompt, d, cfg)
        assert out == ref
        assert all(not ev.tree.is_probe(i) for ev in events for i in ev.accepted_nodes)
        if shape == "fan":  # a probe chain under the root and under every depth-1 candidate
            for ev in events:
                if cfg.max_new_tokens - (ev.new_tokens - len(ev.tokens)) < 4:
                    continue  # near the end the engine prunes the tree to the remaining length
                depth1 = [i for i in range(len(ev.tree)) if ev.tree.parents[i] == -1 and not ev.tree.is_probe(i)]
                chained = {ev.tree.parents[i] for i in range(len(ev.tree)) if ev.tree.is_probe(i)}
                assert set(depth1) <= chained and -1 in chained
        if shape in ("main", "fan"):  # width at depth 1 only; deeper nodes hang under the top-1 path alone
            for ev in events:
                depth = ev.tree.depths()
                drafts = [i for i in range(len(ev.tree)) if not ev.tree.is_probe(i)]
                assert sum(depth[i] == 1 for i in drafts) <= 6
                assert len({ev.tree.parents[i] for i in drafts if depth[i] == 2}) <= 1


def test_device_default_tree_fits_the_cpu_budget(tiny_llama):
    """The CPU default shape stays within 15 nodes (the part of the CPU cost curve it was sized for)."""
    from specdemo.drafters.sdsat.drafter import make

    t = on_cpu(tiny_llama)
    d = make(t, adapter=_noisy_adapter(t))
    d._pending = [list(range(100, 112))] * d.k  # a full set of ranked candidates for every depth
    tree = d.propose(type("S", (), {"tokens": [1, 2, 3]})())
    assert len(tree) <= 15 and sum(tree.is_probe(i) for i in range(len(tree))) == d.k * (d.chains + 1)
    assert "prompt" not in tree.sources  # nothing to look up: no earlier match of a suffix


def test_skip_probe_leaves_out_a_root_probe_that_does_not_pay(tiny_llama):
    """With `skip_probe` a step sends the root's probe only when its row buys more than a step without it: where the
    first extra row costs a plain step's worth (an int4 kernel's new block of rows), the drafts and the probe give
    way to a plain step; where rows are free the probe stays; the output is AR's either way."""
    from specdemo.drafters.sdsat.drafter import make

    t = on_cpu(tiny_llama)
    dear = {0: 1.0, 1: 2.0, 2: 2.05, 3: 2.1, 4: 3.0, 8: 4.0}
    flat = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 8: 1.0}

    def tree(skip: bool, rel: dict[int, float], probe_overhead: float = 0.0) -> DraftTree:
        d = make(t, adapter=_noisy_adapter(t), calibration="none", prompt_lookup=0, skip_probe=skip)
        d.rel_cost = rel
        if skip:  # what `begin` sets up; a probe step measured to take `probe_overhead` AR steps beyond its price
            steps = 2 ** 20  # so many that the prior does not count
            d.probe_pricing = ProbePricing(rel, 0.01, probe_seconds=0.01 * steps * (1 + probe_overhead),
                                           probe_price=float(steps), probe_steps=steps)
        d._pending, d._pending_p = [[100, 101]], [[0.3, 0.1]]  # two depth-1 candidates from the last step's probe
        return d.propose(type("S", (), {"tokens": [1, 2, 3]})())

    def probes(tr: DraftTree) -> int:
        return sum(tr.is_probe(i) for i in range(len(tr)))

    assert len(tree(False, dear)) == 3 and probes(tree(False, dear)) == 1  # without it the root's probe always rides
    assert len(tree(True, dear)) == 0  # 1.65 expected tokens for 2.1 steps' cost: a plain step pays more
    assert len(tree(True, flat)) == 3 and probes(tree(True, flat)) == 1
    assert len(tree(True, flat, probe_overhead=0.5)) == 2  # a probe measured dear in place gives way

    class DearRows(SDSATDrafter):
        def begin(self, state, prompt_hidden) -> None:
            super().begin(state, prompt_hidden)
            self.rel_cost = dear

    cfg = GenerationConfig(max_new_tokens=30)
    prompt = t.encode_prompt(PROMPTS[0])
    ref, _ = run_to_end(t, prompt, None, cfg)
    out, events = run_to_end(t, prompt, DearRows(t, _noisy_adapter(t), k=1, branching="2,1", skip_probe=True), cfg)
    assert out == ref
    assert any(not any(ev.tree.is_probe(i) for i in range(len(ev.tree))) for ev in events[1:])


def test_probe_pricing_measures_what_a_probe_costs_and_brings_in_place(monkeypatch):
    """The probe's overhead is what its steps took beyond the curve's price, in the plain steps' AR step; its yield is
    counted over every step after a probe, net of its drafts' rows at the request's pace."""
    from specdemo.drafters.sdsat import probe_cost

    clock = [0.0]
    monkeypatch.setattr(probe_cost.time, "perf_counter", lambda: clock[0])
    rel = {0: 1.0, 1: 1.5, 2: 1.5, 3: 1.5, 4: 2.0}
    p = ProbePricing(rel, unit_seconds=0.010)

    def step(nodes: int, probe: bool, seconds: float, committed: int = 1, drafted: int = 0, accepted: int = 0):
        p.sent(nodes, probe)
        clock[0] += seconds
        p.verified(committed, drafted, accepted)

    step(0, False, 1.0)  # the first verification after the prefill is not timed
    assert p.unit_seconds == 0.010 and p.overhead == 0.5  # before a probe is timed: one more row's price
    for _ in range(30):
        step(0, False, 0.020)  # in place an AR step takes 20 ms, not the curve's 10
    assert p.unit_seconds == pytest.approx(0.020, rel=1e-3)
    step(1, True, 0.030)  # 1.5 AR steps for a price of 1.5: nothing beyond it
    assert p.overhead == pytest.approx(0.5 * PRIOR_STEPS / (1 + PRIOR_STEPS), rel=1e-2)
    assert p.net_yield == PRIOR_YIELD  # the step after this probe is not verified yet
    pace = p.tokens / p.price
    step(3, False, 0.030, committed=2, drafted=2, accepted=1)  # its 2 drafts cost nothing over the 1-node tree's price
    step(1, True, 0.040)
    step(0, False, 0.020)  # this probe's drafts were not sent: it brought nothing
    assert p.net_yield == pytest.approx((1.0 + 0.0 + PRIOR_STEPS * PRIOR_YIELD) / (2 + PRIOR_STEPS))
    step(1, True, 0.040)
    step(4, False, 0.040, committed=2, drafted=1, accepted=1)  # its draft moved the tree up a stair: 0.5 AR steps
    assert p.yield_sum == pytest.approx(1.0 + 1.0 - 0.5 * p.tokens / p.price) and pace > 0


def test_default_tree_grafts_prompt_lookup_scored_by_ngram_length(tiny_llama):
    from specdemo.drafters.sdsat.drafter import make

    tiny_llama = on_cpu(tiny_llama)  # the CPU's default tree
    d = make(tiny_llama, adapter=_noisy_adapter(tiny_llama), calibration="none")
    d._pending = [list(range(100, 112))] * d.k
    # the suffix 3-gram (5, 6, 7) occurred before, followed by 8, 9, 5, 6, 7: lookup's chain under the root
    tree = d.propose(type("S", (), {"tokens": [5, 6, 7, 8, 9, 5, 6, 7]})())
    ctx = [i for i, s in enumerate(tree.sources) if s == "prompt"]
    assert [tree.tokens[i] for i in ctx] == [8, 9, 5, 6, 7] and tree.parents[ctx[0]] == -1
    assert all(tree.scores[i] == 3.0 for i in ctx)  # raw score: the matched n-gram's length
    assert len(tree) <= 15
    assert len([s for s in make(tiny_llama, adapter=_noisy_adapter(tiny_llama), prompt_lookup=0, calibration="none")
                .propose(type("S", (), {"tokens": [5, 6, 7, 8, 9, 5, 6, 7]})()).sources if s == "prompt"]) == 0


def test_sampling_lossless_tiny(tiny_llama):
    ad = _noisy_adapter(tiny_llama)
    for seed in (1,):
        cfg = GenerationConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=seed))
        prompt = tiny_llama.encode_prompt(PROMPTS[1])
        ref, _ = run_to_end(tiny_llama, prompt, None, cfg)
        for loop in ("fused", "paper"):
            out, _ = run_to_end(tiny_llama, prompt, SDSATDrafter(tiny_llama, ad, k=3, loop=loop, branching="3,2"),
                                cfg)
            assert out == ref


def test_trained_drafts_are_accepted_and_stats(tiny_llama):
    """A drafter whose adapter learned this very continuation gets drafts accepted (tau > 1), still lossless."""
    t = tiny_llama
    prompt = t.encode_prompt(PROMPTS[0])
    cfg = GenerationConfig(max_new_tokens=30)
    ref, _ = run_to_end(t, prompt, None, cfg)
    seq = prompt + ref
    ad = SDSATAdapter(t.model, rank=8, alpha=16, token_id=3)
    _train_steps(t, ad, seq, len(prompt), lr=2e-2, steps=40, rate=0.7, max_probes=200)
    ad.requires_grad_(False)
    d = SDSATDrafter(t, ad, k=3)
    out, events = run_to_end(t, prompt, d, cfg)
    assert out == ref
    assert len(out) / len(events) > 1.2
    assert d.tally.given_reached()[0] > 0 and d.stats["steps"] == len(events) - 1


def test_unavailable_without_adapter(tiny_llama):
    from specdemo.drafters import unavailable_reason

    reason = unavailable_reason("sdsat", tiny_llama)
    assert reason and "train sdsat" in reason
    with pytest.raises(DrafterUnavailable, match="train sdsat"):
        make_drafter("sdsat", tiny_llama)
    with pytest.raises(ValueError):
        SDSATDrafter(tiny_llama, _noisy_adapter(tiny_llama), loop="bogus")


def test_published_fine_tunes_verify_with_themselves(tiny_llama, monkeypatch):
    """The paper's checkpoints (model_verifies): probes are plain rows of the adaptive token id, no adapter; the race
    is exact against the model's own AR, and the page says whose output that is."""
    from specdemo.app.models import availability
    from specdemo.drafters.sdsat import drafter as mod

    t = tiny_llama
    prompt = t.encode_prompt(PROMPTS[0])
    cfg = GenerationConfig(max_new_tokens=30)
    ref, _ = run_to_end(t, prompt, None, cfg)
    d = make_drafter("sdsat", t, model_verifies=True, token_id=5, k=3)
    assert isinstance(d.adapter, mod.SelfAdapter) and d.adapter.token_id == 5
    out, events = run_to_end(t, prompt, d, cfg)
    assert out == ref
    assert any(ev.tree.tokens[i] == 5 for ev in events for i in range(len(ev.tree)) if ev.tree.is_probe(i))
    with pytest.raises(ValueError, match="token_id"):
        make_drafter("sdsat", t, model_verifies=True)  # not a published model: the id must be given
    assert "sdsat:note" not in availability(t)
    monkeypatch.setattr(t, "name", "ainergy/CodeLlama-SDSAT_L5_7B")
    monkeypatch.setitem(mod.PUBLISHED, t.name, 7)
    assert mod.unavailable_reason(t) is None
    assert make_drafter("sdsat", t).adapter.token_id == 7  # picked by name, no option needed
    assert "fine-tuned model" in availability(t)["sdsat:note"]


# ---------------------------------------------------------------- the shipped adapter on the embedded model
def test_embedded_shipped_adapter_lossless(embedded):
    assert (default_artifact_dir(embedded) / "sdsat_config.json").exists(), "the shipped adapter is missing"
    from specdemo.drafters import unavailable_reason

    assert unavailable_reason("sdsat", embedded) is None
    prompt = embedded.encode_prompt("Write a Python function that checks whether a string is a palindrome.")
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9, seed=3)):
        cfg = GenerationConfig(max_new_tokens=40, sampling=sampling)
        ref, ref_ev = run_to_end(embedded, prompt, None, cfg)
        for loop in ("fused", "paper"):
            out, ev = run_to_end(embedded, prompt, make_drafter("sdsat", embedded, loop=loop), cfg)
            assert out == ref


@pytest.mark.slow
def test_accelerate_launch_with_two_processes_trains_the_adapter_one_process_trains(tiny_llama, tmp_path):
    """Data parallelism: four sequences a step, two per process; every process draws every sequence's probes (one
    generator, in step) and trains its own, and the gradients are summed, so two processes take one process's
    optimizer steps (to float round-off; two steps, as Adam's first is lr * sign(g))."""
    import os
    import shutil
    import subprocess
    import sys

    from specdemo import cli

    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("accelerate's launcher is not installed")
    t = tiny_llama
    data = tmp_path / "corpus.jsonl.gz"
    with gzip.open(data, "wt") as f:
        f.write(json.dumps({"format": "specdemo-selfdistill"}) + "\n")
        for i, text in enumerate(PROMPTS * 3):
            prompt = t.encode_prompt(text + " " * i)
            ref, _ = run_to_end(t, prompt, None, GenerationConfig(max_new_tokens=20))
            f.write(json.dumps({"id": f"r{i}", "prompt_ids": prompt, "answer_ids": ref}) + "\n")

    def args(out) -> list[str]:
        return ["train", "sdsat", "--model", t.model.config._name_or_path, "--data", str(data), "--out", str(out),
                "--L", "3", "--rank", "2", "--alpha", "4", "--steps", "2", "--warmup", "1", "--seqs-per-step", "4",
                "--lr", "3e-3", "--heldout-max", "0", "--ckpt-every", "100", "--device", "cpu"]

    assert cli.main(args(tmp_path / "one")) == 0
    env = cpu_processes_env()
    done = subprocess.run([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29521",
                           "-m", "specdemo", *args(tmp_path / "two")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "data parallel over 2 processes" in done.stdout
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=False)["adapter"]
    two = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)["adapter"]
    assert one.keys() == two.keys()
    moved = max(float(v.abs().max()) for k, v in one.items() if "lora_B" in k)  # LoRA's B starts at zero
    assert moved > 2e-3
    for k in one:
        assert torch.allclose(one[k], two[k], rtol=0, atol=1e-4), k
