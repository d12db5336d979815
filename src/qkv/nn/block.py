"""The Transformer block (Vaswani et al. 2017, Figure 1).

    post-LN (the paper):  x = Norm(x + Attn(x));   x = Norm(x + FFN(x))
    pre-LN (GPT-2, LLaMA): x = x + Attn(Norm(x));  x = x + FFN(Norm(x))
    parallel (GPT-J, GPT-NeoX's Pythia): x = x + Attn(Norm(x)) + FFN(Norm'(x))   (ParallelTransformerBlock)
    sandwich (Gemma 2/3):  x = x + Norm(Attn(Norm(x)));  x = x + Norm(FFN(Norm(x)))   (SandwichTransformerBlock)
    post-sublayer (OLMo-2): x = x + Norm(Attn(x));   x = x + Norm(FFN(x))   (PostSublayerTransformerBlock)

A decoder block of the encoder-decoder model adds cross-attention between the two.
Shapes: B batch, T target length, S source length, C model width, H heads.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .layers import FeedForward, make_norm
from .moe import MixtureOfExperts


class BlockOutput(NamedTuple):
    """What a block returns; the weights are None unless asked for (``return_weights=True``)."""

    hidden: Tensor  # (B, T, C)
    self_attention: Tensor | None  # (B, H, T, T'), T' = keys seen (cached ones too)
    cross_attention: Tensor | None  # (B, H, T, S)


class RoutedBlockOutput(NamedTuple):
    """``BlockOutput`` and the router logits of a mixture-of-experts feed-forward, what a block returns when asked
    for them (``return_router_logits=True``)."""

    hidden: Tensor  # (B, T, C)
    self_attention: Tensor | None  # (B, H, T, T')
    cross_attention: Tensor | None  # (B, H, T, S)
    router_logits: Tensor | None  # (B·T, E); None for a dense feed-forward


def block_output(x: Tensor, w_self, w_cross, router_logits, routed: bool) -> BlockOutput | RoutedBlockOutput:
    """The block's output, with the router logits where they were asked for (``routed``)."""
    return RoutedBlockOutput(x, w_self, w_cross, router_logits) if routed else BlockOutput(x, w_self, w_cross)


class TransformerBlock(nn.Module):
    """Attention → Add & Norm → [cross-attention → Add & Norm] → feed-forward → Add & Norm.

    Built from its sizes (the paper's parts: ``MultiHeadAttention`` and ``FeedForward``), or from parts
    made elsewhere with ``from_parts`` (``qkv.models.components`` builds each layer's from its config).
    """

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
        attn = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout,
                                  rope=rope, alibi=alibi)
        cross = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias,
                                   dropout=dropout) if cross_attention else None
        ff = FeedForward(d_model, d_ff, activation, bias=bias, dropout=dropout)
        self.assemble(attn, ff, lambda: make_norm(norm, d_model, norm_eps), norm_first=norm_first,
                      cross_attn=cross, dropout=dropout)

    @classmethod
    def from_parts(cls, attn: nn.Module, ff: nn.Module, norm: Callable[[], nn.Module], *, norm_first: bool,
                   cross_attn: nn.Module | None = None, dropout: float = 0.0) -> "TransformerBlock":
        """A block around ready-made sublayers: ``attn`` (self-attention), ``ff``, optionally ``cross_attn``;
        ``norm()`` makes each sublayer's norm. The attention is any module with ``MultiHeadAttention``'s call."""
        block = cls.__new__(cls)
        block.assemble(attn, ff, norm, norm_first=norm_first, cross_attn=cross_attn, dropout=dropout)
        return block

    def assemble(self, attn: nn.Module, ff: nn.Module, norm: Callable[[], nn.Module], *, norm_first: bool,
                 cross_attn: nn.Module | None, dropout: float) -> None:
        nn.Module.__init__(self)
        self.norm_first = norm_first
        self.attn, self.attn_norm = attn, norm()
        self.cross_attn, self.cross_norm = (cross_attn, norm()) if cross_attn is not None else (None, None)
        self.ff, self.ff_norm = ff, norm()
        self.drop = nn.Dropout(dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn) -> tuple[Tensor, Tensor | None]:
        """One residual sublayer, pre- or post-norm; fn returns out, or (out, weights)."""
        r = fn(norm(x) if self.norm_first else x)
        out, weights = split(r)
        x = x + (self.drop(out) if self.training else out)  # skip the call: decoding pays per module call
        return (x if self.norm_first else norm(x)), weights

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        context_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        context_mask: Tensor | None = None,
        kv_cache=None,
        input_pos: Tensor | None = None,
        return_weights: bool = False,
        rope_positions: Tensor | None = None,
        return_router_logits: bool = False,
    ) -> BlockOutput | RoutedBlockOutput:
        """x (B, T, C) [, context (B, S, C) or its ``context_kv``] -> BlockOutput.

        ``mask`` / ``context_mask``: bool, True = may attend, for self- and cross-attention.
        ``context_kv``: the context's keys and values, ``cross_attn.project_kv(context)``,
        computed once per source for step-by-step decoding. ``rope_positions``: x's real positions, for a RoPE
        whose table follows the length (passed to the self-attention only when given). ``return_router_logits``:
        a ``RoutedBlockOutput``, with a mixture-of-experts feed-forward's router logits (the auxiliary losses read
        them).
        """
        if (context is not None or context_kv is not None) != (self.cross_attn is not None):
            raise ValueError(
                "context (or context_kv) must be given exactly when the block has cross_attention "
                f"(cross_attention={self.cross_attn is not None}, context given={context is not None}, "
                f"context_kv given={context_kv is not None})"
            )
        x, w_self = self._sublayer(x, self.attn_norm, lambda h: self.self_attend(
            h, mask, is_causal, kv_cache, input_pos, return_weights, rope_positions))
        w_cross = None
        if self.cross_attn is not None:
            x, w_cross = self._sublayer(x, self.cross_norm, lambda h: self.cross_attn(
                h, context, context_kv=context_kv, mask=context_mask, return_weights=return_weights))
        x, router_logits = self._sublayer(x, self.ff_norm, lambda h: self.feed(h, return_router_logits))
        return block_output(x, w_self, w_cross, router_logits, return_router_logits)

    def feed(self, h: Tensor, return_router_logits: bool = False):
        """The feed-forward sublayer's call: out, or (out, router logits (B·T, E)) from a mixture of experts asked
        for them."""
        if return_router_logits and isinstance(self.ff, MixtureOfExperts):
            return self.ff(h, return_router_logits=True)
        return self.ff(h)

    def self_attend(self, h: Tensor, mask, is_causal: bool, kv_cache, input_pos: Tensor | None, return_weights: bool,
                    rope_positions: Tensor | None):
        """The self-attention sublayer's call: out, or (out, weights); ``rope_positions`` only where given (an
        attention module of one's own need not take it)."""
        extra = {} if rope_positions is None else {"rope_positions": rope_positions}
        return self.attn(h, mask=mask, is_causal=is_causal, kv_cache=kv_cache, input_pos=input_pos,
                         return_weights=return_weights, **extra)


def split(r) -> tuple[Tensor, Tensor | None]:
    """A sublayer's (out, second) from its out, or (out, second)."""
    return r if isinstance(r, tuple) else (r, None)


def check_pre_norm_self_attention(kind: str, norm_first: bool, cross_attn: nn.Module | None) -> None:
    """A block variant that exists only pre-norm and without cross-attention (parallel, sandwich-norm)."""
    if not norm_first or cross_attn is not None:
        raise ValueError(f"a {kind} block is pre-norm without cross-attention, got "
                         f"norm_first={norm_first}, cross_attention={cross_attn is not None}")


class ParallelTransformerBlock(TransformerBlock):
    """x = x + Attn(Norm(x)) + FFN(Norm'(x)): both sublayers read the block's input (Wang & Komatsuzaki's GPT-J,
    GPT-NeoX's use_parallel_residual, Pythia), each through its own norm. Pre-norm only, no cross-attention;
    built as ``TransformerBlock`` is (``qkv.models.components`` makes it for ``feed_forward.parallel``)."""

    def assemble(self, attn: nn.Module, ff: nn.Module, norm: Callable[[], nn.Module], *, norm_first: bool,
                 cross_attn: nn.Module | None, dropout: float) -> None:
        check_pre_norm_self_attention("parallel", norm_first, cross_attn)
        super().assemble(attn, ff, norm, norm_first=norm_first, cross_attn=None, dropout=dropout)

    def forward(self, x: Tensor, context: Tensor | None = None, *, context_kv: tuple[Tensor, Tensor] | None = None,
                mask: Tensor | None = None, is_causal: bool = False, context_mask: Tensor | None = None,
                kv_cache=None, input_pos: Tensor | None = None, return_weights: bool = False,
                rope_positions: Tensor | None = None,
                return_router_logits: bool = False) -> BlockOutput | RoutedBlockOutput:
        """x (B, T, C) -> BlockOutput, arguments as ``TransformerBlock.forward`` (no context: none to attend to)."""
        if context is not None or context_kv is not None or context_mask is not None:
            raise ValueError("a parallel block has no cross-attention: pass no context, context_kv or context_mask")
        r = self.self_attend(self.attn_norm(x), mask, is_causal, kv_cache, input_pos, return_weights, rope_positions)
        attended, weights = split(r)
        fed, router_logits = split(self.feed(self.ff_norm(x), return_router_logits))  # (B, T, C), from x itself
        if self.training:
            attended, fed = self.drop(attended), self.drop(fed)
        return block_output(x + attended + fed, weights, None, router_logits, return_router_logits)


class SandwichTransformerBlock(TransformerBlock):
    """x = x + Norm₂(Attn(Norm₁(x)));  x = x + Norm₄(FFN(Norm₃(x))): pre-norm with a norm after each sublayer
    too, before its residual add (Gemma 2/3's four norms: input_layernorm = ``attn_norm``,
    post_attention_layernorm = ``attn_post_norm``, pre_feedforward_layernorm = ``ff_norm``,
    post_feedforward_layernorm = ``ff_post_norm``; CogView's "sandwich-LN", Ding et al. 2021).
    Pre-norm only, no cross-attention; ``qkv.models.components`` makes it for ``normalization.sandwich``."""

    def assemble(self, attn: nn.Module, ff: nn.Module, norm: Callable[[], nn.Module], *, norm_first: bool,
                 cross_attn: nn.Module | None, dropout: float) -> None:
        check_pre_norm_self_attention("sandwich-norm", norm_first, cross_attn)
        super().assemble(attn, ff, norm, norm_first=norm_first, cross_attn=None, dropout=dropout)
        self.attn_post_norm, self.ff_post_norm = norm(), norm()

    def forward(self, x: Tensor, context: Tensor | None = None, *, context_kv: tuple[Tensor, Tensor] | None = None,
                mask: Tensor | None = None, is_causal: bool = False, context_mask: Tensor | None = None,
                kv_cache=None, input_pos: Tensor | None = None, return_weights: bool = False,
                rope_positions: Tensor | None = None,
                return_router_logits: bool = False) -> BlockOutput | RoutedBlockOutput:
        """x (B, T, C) -> BlockOutput, arguments as ``TransformerBlock.forward`` (no context: none to attend to)."""
        if context is not None or context_kv is not None or context_mask is not None:
            raise ValueError("a sandwich-norm block has no cross-attention: pass no context, context_kv or "
                             "context_mask")
        r = self.self_attend(self.attn_norm(x), mask, is_causal, kv_cache, input_pos, return_weights, rope_positions)
        attended, weights = split(r)
        x = x + self._dropped(self.attn_post_norm(attended))  # (B, T, C)
        fed, router_logits = split(self.feed(self.ff_norm(x), return_router_logits))  # (B, T, C)
        x = x + self._dropped(self.ff_post_norm(fed))
        return block_output(x, weights, None, router_logits, return_router_logits)

    def _dropped(self, h: Tensor) -> Tensor:
        return self.drop(h) if self.training else h


class PostSublayerTransformerBlock(TransformerBlock):
    """x = x + Norm₁(Attn(x));  x = x + Norm₂(FFN(x)): each sublayer reads the residual stream as it is and its
    output is normalised before the add (OLMo 2, OLMo et al. 2024: post_attention_layernorm = ``attn_norm``,
    post_feedforward_layernorm = ``ff_norm``); the paper's post-LN normalises after the add instead.
    Built as ``TransformerBlock`` with norm_first=False (``qkv.models.components`` makes it for
    ``normalization.post_sublayer``)."""

    def assemble(self, attn: nn.Module, ff: nn.Module, norm: Callable[[], nn.Module], *, norm_first: bool,
                 cross_attn: nn.Module | None, dropout: float) -> None:
        if norm_first:
            raise ValueError("a post-sublayer-norm block normalises after each sublayer: norm_first must be False")
        super().assemble(attn, ff, norm, norm_first=False, cross_attn=cross_attn, dropout=dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn) -> tuple[Tensor, Tensor | None]:
        """x + Norm(fn(x)); fn returns out, or (out, weights)."""
        r = fn(x)
        out, weights = split(r)
        out = norm(out)  # (B, T, C), before the residual add
        return x + (self.drop(out) if self.training else out), weights
