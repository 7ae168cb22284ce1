"""Token choice that is the same in every decoding mode.

Greedy is argmax.  Sampling uses the Gumbel-max trick with noise drawn from an RNG keyed on (seed, absolute position)
only: the token at position t is argmax(filtered_logits / T + G(seed, t)), an exact sample of the target's
(temperature, top-k, top-p) distribution.  Because the noise does not depend on how many tokens were drafted,
AR and speculative decoding draw the *same* sample for the same seed — and verification can draw one sample per tree
node and walk down the tree, which is exactly lossless.
"""
from __future__ import annotations

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


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Gumbel noise for one absolute position, from an RNG keyed on (seed, position) only (CPU, device-independent)."""
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little")
    u = torch.rand(vocab, generator=torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF), dtype=torch.float64)
    return -torch.log(-torch.log(u.clamp_min(1e-300)))


def choose_tokens(logits: torch.Tensor, positions: list[int], cfg: SamplingConfig) -> list[int]:
    """The target's token for each row of logits (n, V); row i is the distribution of absolute position positions[i]."""
    if cfg.greedy:
        return logits.argmax(-1).tolist()
    filtered = filter_logits(logits.float(), cfg).cpu().double()
    noise_by_pos: dict[int, torch.Tensor] = {}
    out = []
    for row, pos in zip(filtered, positions):
        if pos not in noise_by_pos:  # nodes at the same depth share their position's noise
            noise_by_pos[pos] = position_noise(cfg.seed, pos, row.shape[-1])
        out.append(int((row + noise_by_pos[pos]).argmax()))
    return out
