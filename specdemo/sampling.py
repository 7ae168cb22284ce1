"""Token choice that is the same in every decoding mode: the rule speculative sampling here implements.

The rule, for a row of logits whose token lands at absolute position t (`reference_tokens` writes it out over the
whole vocabulary):

    greedy     token = argmax(logits)
    sampling   token = argmax(filter_logits(logits) + G(seed, t))

filter_logits divides by the temperature and sets what top-k and top-p remove to -inf; G(seed, t) is Gumbel noise
from an RNG keyed on (seed, t) only (`position_noise`).  By the Gumbel-max trick the token is an exact sample of the
target's (temperature, top-k, top-p) distribution.  Because the noise does not depend on how many tokens were
drafted, AR and speculative decoding draw the *same* sample for the same seed, and verification can draw one sample
per tree node and walk down the tree, which is exactly lossless.

`choose_tokens` is what the engine calls.  It returns exactly `reference_tokens`' tokens; for sampling it hands the
rows to sampling_fast.py, which settles the filter from a few top candidates per row and takes the noise's logs only
at the kept tokens, instead of sorting every row and taking two float64 logs per token of the vocabulary
(tests/test_sampling_fast.py holds the two to the same tokens).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")


def filter_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k and top-p applied to a (n, V) float32 tensor; removed tokens get -inf."""
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= cfg.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@functools.lru_cache(maxsize=32)
def position_uniforms(seed: int, position: int, vocab: int) -> torch.Tensor:
    """The uniforms behind position_noise: float64, one per token id, from an RNG keyed on (seed, position) only.

    Cached (read-only: callers index or copy it) because a tree step's deeper positions come back in the next step,
    and a side-by-side AR run with the same seed asks for the same positions.
    """
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little")
    return torch.rand(vocab, generator=torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF), dtype=torch.float64)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) from uniforms; elementwise, so a gathered subset of a position's uniforms gives exactly the values
    the whole vector would at those ids (tests/test_sampling_fast.py checks the log kernel agrees bit for bit)."""
    return -torch.log(-torch.log(u.clamp_min(1e-300)))


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Gumbel noise for one absolute position, from an RNG keyed on (seed, position) only (CPU, device-independent)."""
    return gumbel(position_uniforms(seed, position, vocab))


def reference_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    """The rule itself, over the whole vocabulary: row i of logits (n, V) is the distribution of absolute position
    positions[i]; its token is argmax(filter_logits(row) + position_noise(seed, positions[i])), or argmax(row) when
    greedy.  Readable and slow: a sort and two float64 logs per token of every row."""
    if cfg.greedy:
        return logits.argmax(-1).tolist()
    filtered = filter_logits(logits.detach().float(), cfg).cpu().double()
    return [int((row + position_noise(cfg.seed, pos, row.shape[-1])).argmax()) for row, pos in zip(filtered, positions)]


def choose_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    """The target's token for each row of logits (n, V), row i landing at absolute position positions[i]: exactly
    `reference_tokens`' tokens, computed without a full sort or a full-vocabulary noise wherever a few top candidates
    settle the filter (sampling_fast.py)."""
    if cfg.greedy:  # max's index is argmax's (the first maximal one) at a third of the cost on the CPU
        return logits.max(-1).indices.tolist()
    # imported on use: sampling_fast builds on this module's rule, so a module-level import would be a cycle
    from specdemo.sampling_fast import sampled_tokens

    return sampled_tokens(logits, positions, cfg)


def draft_candidates(logp: torch.Tensor, ids: torch.Tensor | None, positions: list[int], cfg: SamplingConfig,
                     vocab: int, k: int, sharpen: float = 1.0, pool: int = 64) -> tuple[list[list[int]], list[list[float]]]:
    """A drafter's `k` candidates for each row of its log-probs `logp` (n, V'), row i guessing the target's token at
    absolute position positions[i]; `ids` maps column j to target token ids[j] (None: the columns are the ids) and
    `vocab` is the width of the target's logits.  Returns (token ids, log-scores) per row, best first.

    Greedy: the k most probable tokens and their log-probs.  Sampling: the target will take argmax(filtered logits /
    T + G(seed, t)) (the rule above), and the noise G is known before the target runs, so the drafter draws with
    that same noise: its candidates are the Gumbel-top-k of its own distribution, filtered by the request's top-k and
    top-p, under G(seed, t).  Where the draft distribution is close to the target's the two argmaxes coincide
    (Gumbel coupling), so the first candidate is the target's sample far more often than the draft's most probable
    token is, while the verification stays the exact rule.  A drafter flatter than the target (a weak head spreads
    its mass) draws better from its distribution sharpened, log-probs × `sharpen` (each drafter's is chosen on tune
    prompts).  The log-scores are the softmax of the perturbed scores over the candidates: how clearly the noise
    picks each one, which the calibration maps to an acceptance rate.  Only the draft's `pool` most probable tokens
    compete (the filter keeps few more at these temperatures)."""
    logp = logp.float()
    if cfg.greedy:
        lp, col = logp.topk(k, -1)
        tok = col if ids is None else ids[col]
        return tok.tolist(), lp.tolist()
    tempered = (logp * (sharpen / cfg.temperature)).log_softmax(-1)  # what the rule samples, top-p included
    top_k = cfg.top_k if 0 < cfg.top_k < logp.shape[-1] else 0
    lp, col = tempered.topk(min(max(pool, top_k), logp.shape[-1]), -1)  # sorted, most probable first
    tok = col if ids is None else ids[col]
    # the rule's filter on the draft's own distribution, in its order: top-k, then top-p over what top-k kept (the
    # first candidate always stays); exact within the candidates, which is all that competes
    p = lp.exp()
    if top_k:
        p[:, top_k:] = 0
        p = p / p.sum(-1, keepdim=True)
    drop = p.cumsum(-1) - p >= cfg.top_p
    if top_k:
        drop[:, top_k:] = True
    noise = torch.stack([gumbel(position_uniforms(cfg.seed, pos, vocab)[t]) for pos, t in zip(positions, tok.cpu())])
    score = (lp.double() + noise.to(lp.device)).masked_fill(drop, float("-inf"))  # float64 like the rule's sums
    best, order = score.topk(min(k, score.shape[-1]), -1)
    # candidates the filter removed come last, with a share that calibrates to ~0 (a fixed tree still fills its slots)
    log_share = (best - score.logsumexp(-1, keepdim=True)).clamp_min(-30.0)
    return tok.gather(-1, order).tolist(), log_share.float().tolist()


def top2_gaps(logits: torch.Tensor, rows: list[int]) -> list[float]:
    """How far apart the best two logits of each of `rows` are.  A small gap is a near-tie: there a product computed
    with other kernels or in another order (a GPU's bf16 tree rows) may pick the other token, so a run that differs
    from AR shows the gap where it first differs."""
    picked = logits[rows].float()  # a copy (indexed by a list): the best can be masked in place
    best, where = picked.max(-1, keepdim=True)  # a max and a masked max: ~0.7 of topk(2)'s time over a vocabulary
    return (best[:, 0] - picked.scatter_(-1, where, float("-inf")).amax(-1)).tolist()
