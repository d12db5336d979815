"""The Transformer block (Vaswani et al. 2017, Figure 1).

    post-LN (the paper):  x = Norm(x + Attn(x));   x = Norm(x + FFN(x))
    pre-LN (GPT-2, LLaMA): x = x + Attn(Norm(x));  x = x + FFN(Norm(x))

A decoder block of the encoder-decoder model adds cross-attention between the two.
Shapes: B batch, T target length, S source length, C model width, H heads.
"""
from __future__ import annotations

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .layers import FeedForward, make_norm


class TransformerBlock(nn.Module):
    """Attention → Add & Norm → [cross-attention → Add & Norm] → feed-forward → Add & Norm."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        norm_first: bool = False,
        cross_attention: bool = False,
        dropout: float = 0.0,
        num_kv_heads: int | None = None,
        activation: str = "relu",
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        bias: bool = True,
        rope: nn.Module | None = None,
        alibi: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout, rope=rope, alibi=alibi
        )
        self.attn_norm = make_norm(norm, d_model, norm_eps)
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout)
            self.cross_norm = make_norm(norm, d_model, norm_eps)
        else:
            self.cross_attn = self.cross_norm = None
        self.ff = FeedForward(d_model, d_ff, activation, bias=bias, dropout=dropout)
        self.ff_norm = make_norm(norm, d_model, norm_eps)
        self.drop = nn.Dropout(dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn) -> tuple[Tensor, Tensor | None]:
        """One residual sublayer, pre- or post-norm; fn returns (out, weights-or-None)."""
        if self.norm_first:
            out, w = fn(norm(x))
            return x + self.drop(out), w
        out, w = fn(x)
        return norm(x + self.drop(out)), w

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        context_mask: Tensor | None = None,
        kv_cache=None,
        input_pos: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor | None]:
        """x (B, T, C) [, context (B, S, C)] -> (B, T, C) [, self weights (B, H, T, T'), cross weights].

        ``mask`` / ``context_mask``: bool, True = may attend, for self- and cross-attention.
        """
        if (context is not None) != (self.cross_attn is not None):
            raise ValueError(
                "context must be given exactly when the block has cross_attention "
                f"(cross_attention={self.cross_attn is not None}, context given={context is not None})"
            )

        def attn(h):
            r = self.attn(h, mask=mask, is_causal=is_causal, kv_cache=kv_cache, input_pos=input_pos,
                          return_weights=return_weights)
            return r if return_weights else (r, None)

        def cross(h):
            r = self.cross_attn(h, context, mask=context_mask, return_weights=return_weights)
            return r if return_weights else (r, None)

        x, w_self = self._sublayer(x, self.attn_norm, attn)
        w_cross = None
        if self.cross_attn is not None:
            x, w_cross = self._sublayer(x, self.cross_norm, cross)
        x, _ = self._sublayer(x, self.ff_norm, lambda h: (self.ff(h), None))
        return (x, w_self, w_cross) if return_weights else x
