"""Sampling as small functions: logits → filtered logits → next token (gpt-fast's shape).

Shapes: B batch, V vocabulary.
"""
from __future__ import annotations

import torch
from torch import Tensor


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (B, V); the rest become -inf."""
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set whose probability reaches p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= p  # mass before this token already reaches p; the top token stays
    drop = drop.scatter(-1, order, drop)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def next_token(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) -> token ids (B,). temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
