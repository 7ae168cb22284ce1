"""sampling.draft_candidates: a drafter's candidates, drawn under sampling with the noise the target's token will be
drawn with (Gumbel coupling).  No model is loaded: logits are random tensors, the target's token is the rule itself
(sampling.reference_tokens)."""
from __future__ import annotations

import torch

from specdemo.sampling import SamplingConfig, draft_candidates, reference_tokens

VOCAB = 500


def _logits(n: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_candidates_are_the_most_probable_tokens_mapped_to_target_ids():
    logp = _logits(4, 0).log_softmax(-1)
    ids = torch.arange(VOCAB) * 3 + 7  # a draft vocabulary: column j is target token 3j + 7
    tokens, scores = draft_candidates(logp, ids, [5, 6, 7, 8], SamplingConfig(), VOCAB * 3 + 7, k=3)
    lp, col = logp.topk(3, -1)
    assert tokens == (col * 3 + 7).tolist()
    assert torch.allclose(torch.tensor(scores), lp)


def test_with_the_targets_own_distribution_the_first_candidate_is_the_targets_sample():
    """Same logits on both sides: the coupled draw is the rule's draw at every position, seed and filter (top-k,
    top-p, both: the rule's own kept set)."""
    logits = _logits(64, 1)
    positions = list(range(100, 164))
    for cfg in (SamplingConfig(0.8, 0.9, seed=11), SamplingConfig(1.0, 1.0, 20, seed=3), SamplingConfig(0.5, seed=9),
                SamplingConfig(0.8, 0.9, 20, seed=5)):
        tokens, _ = draft_candidates(logits.log_softmax(-1), None, positions, cfg, VOCAB, k=3, pool=VOCAB)
        assert [t[0] for t in tokens] == reference_tokens(logits, positions, cfg)


def test_coupling_makes_a_near_draft_agree_with_the_sample_more_often_than_its_most_probable_token():
    """A draft distribution near the target's: its coupled first candidate is the target's sample far more often than
    its argmax is (the point of coupling), and switching it off gives the argmax back."""
    target = _logits(400, 2, scale=1.5)
    draft = (target + 0.3 * _logits(400, 3, scale=1.0)).log_softmax(-1)
    positions = list(range(400))
    cfg = SamplingConfig(0.8, 0.9, seed=11)
    sampled = reference_tokens(target, positions, cfg)
    coupled = [t[0] for t in draft_candidates(draft, None, positions, cfg, VOCAB, k=2, pool=VOCAB)[0]]
    argmax = [t[0] for t in draft_candidates(draft, None, positions, SamplingConfig(), VOCAB, k=2)[0]]
    hit = sum(a == b for a, b in zip(coupled, sampled)) / len(sampled)
    hit_argmax = sum(a == b for a, b in zip(argmax, sampled)) / len(sampled)
    assert hit > 0.6 and hit > 3 * hit_argmax, (hit, hit_argmax)
    assert argmax == draft.argmax(-1).tolist()


def test_filtered_tokens_come_last_and_scores_are_log_shares():
    """Top-k 2: only two tokens can be the sample, so a third candidate ranks after them with a share of ~0; the
    kept ones' shares are a distribution's (they sum to 1 with nothing else kept)."""
    logp = _logits(8, 4).log_softmax(-1)
    cfg = SamplingConfig(1.0, 1.0, 2, seed=5)
    tokens, scores = draft_candidates(logp, None, list(range(8)), cfg, VOCAB, k=3)
    top2 = logp.topk(2, -1).indices.tolist()
    for toks, sc, allowed in zip(tokens, scores, top2):
        assert sorted(toks[:2]) == sorted(allowed) and toks[2] not in allowed
        assert abs(sum(torch.tensor(sc[:2]).exp().tolist()) - 1) < 1e-5 and sc[2] <= -29.9
