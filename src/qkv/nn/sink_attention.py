"""Attention sinks: a learned logit per head that joins every row's softmax denominator (gpt-oss; Xiao et al. 2023,
arXiv 2309.17453, "Efficient Streaming Language Models with Attention Sinks", learned here as one scalar per head).

    weights_ij = exp(s_ij) / (exp(sink_h) + Σ_j' exp(s_ij'))       s = Q Kᵀ · scale (+ bias), masked
    out_i      = Σ_j weights_ij v_j                                   (the sink has no value: it only absorbs mass)

so a row's weights sum to less than one, and a query that may attend to nothing gets zero weights and a zero
output. Computed as one more key: k_sink = 0 and v_sink = 0, always allowed, with score bias sink_h (q · 0 = 0,
and a soft cap leaves 0 at 0), which both attention paths (the reference formula and the fused kernel) take as
they are; the sink's column is dropped from the weights returned.

Shapes: B batch, H query heads, G key/value heads, L queries, S keys, D head width.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention, attend, check_mask
from .masks import PreparedMask, causal_mask


def sink_attention(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, *, mask: Tensor | None = None,
                   bias: Tensor | None = None, is_causal: bool = False, scale: float | None = None,
                   dropout_p: float = 0.0, return_weights: bool = False,
                   softcap: float | None = None) -> tuple[Tensor, Tensor | None]:
    """softmax over [scores, sink] per row, the sink's weight dropped: q (B, H, L, D) over k, v (B, G, S, D),
    sinks (H,); mask bool (True = may attend) broadcastable to (B, H, L, S); bias float, added to the scores.
    Returns out (B, H, L, D) and weights (B, H, L, S) where asked (else None)."""
    B, H, L, _ = q.shape
    S = k.size(-2)
    if sinks.shape != (H,):
        raise ValueError(f"sinks must hold one logit per query head, shape ({H},), got {tuple(sinks.shape)}")
    allowed = mask.allowed if isinstance(mask, PreparedMask) else mask
    if is_causal:
        causal = causal_mask(L, S, device=q.device)  # (L, S), bottom-right aligned
        allowed = causal if allowed is None else allowed & causal
    zero = k.new_zeros(*k.shape[:-2], 1, k.size(-1))  # (B, G, 1, D): the sink's key, and its value
    k, v = torch.cat([k, zero], dim=-2), torch.cat([v, zero[..., :v.size(-1)]], dim=-2)  # (B, G, S + 1, D)
    full = (B, H, L, S)
    scores_bias = q.new_zeros(full) if bias is None else bias.to(q.dtype).expand(full)
    sink = sinks.to(q.dtype).view(1, H, 1, 1).expand(B, H, L, 1)  # (B, H, L, 1)
    scores_bias = torch.cat([scores_bias, sink], dim=-1)  # (B, H, L, S + 1)
    if allowed is not None:
        allowed = torch.cat([allowed.expand(full), allowed.new_ones(B, H, L, 1)], dim=-1)  # the sink always open
    res = attend(q, k, v, mask=allowed, bias=scores_bias, scale=scale, dropout_p=dropout_p,
                 return_weights=return_weights, softcap=softcap)
    return (res[0], res[1][..., :S]) if return_weights else (res, None)


class SinkAttention(MultiHeadAttention):
    """``MultiHeadAttention`` whose heads each have a learned sink logit (``sinks``, (H,); Hugging Face's name),
    attending by ``sink_attention``; everything else (grouped heads, biases, RoPE, caches, masks) as its parent's."""

    def __init__(self, d_model: int, num_heads: int, **kwargs) -> None:
        super().__init__(d_model, num_heads, **kwargs)
        self.sinks = nn.Parameter(torch.zeros(num_heads))  # (H,)

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool,
                     positions: Tensor | None, return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """q (B, H, L, D) over k, v (B, G, S, D) -> out (B, H, L, D), weights (B, H, L, S) or None."""
        scores_bias = self.alibi if self.relative_bias is None else self.relative_bias
        bias = None if scores_bias is None else scores_bias(q.size(-2), k.size(-2), positions=positions)  # (…, L, S)
        if not isinstance(mask, PreparedMask):  # q, k, v are ours; the mask is the caller's
            check_mask(mask, None, (*q.shape[:-1], k.size(-2)))
        return sink_attention(q, k, v, self.sinks, mask=mask, bias=bias, is_causal=is_causal, scale=self.scale,
                              dropout_p=self.dropout if self.training else 0.0, return_weights=return_weights,
                              softcap=self.softcap)
