"""Scaled dot-product attention, the spec's self-attention and multi-head attention.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V          (Vaswani et al. 2017, eq. 1)
    MultiHead(X) = Concat(head_1, …, head_h) W_O,  head_i = Attention(X W_Q^i, X W_K^i, X W_V^i)

Variants of today's open models, each an argument of the same formula:
    QK-norm      q, k ← RMSNorm(q), RMSNorm(k) over each head's D, before RoPE   (Qwen3, Gemma 3)
    scale        Q Kᵀ · s, s = query_pre_attn_scalar^-½ instead of D^-½            (Gemma 2/3)
    soft-cap     scores ← cap · tanh(scores / cap), before the mask               (Gemma 2)
    window       keys p − W < j ≤ p only (``qkv.masks.sliding_window_mask``)       (Mistral, Gemma 2/3)

Shapes: B batch, L query length, S key length, C model width, H query heads,
G key/value heads (G divides H), D head width (C / H unless given: Qwen3 and Gemma set it apart).
Masks: bool True = may attend; float bias is added to the scores (see ``qkv.masks``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_fraction, check_positive_int
from .kv_cache import RingKVCache
from .layers import ProjectionRMSNorm, check_softcap, soft_cap
from .masks import (PreparedMask, causal_mask, causal_mask_at, crop_keys, prepare_mask, select_keys,
                    sliding_window_mask, within_window)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool = False) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., len, dim), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k must share their last dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v must have the same length, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not (q.dim() == k.dim() == v.dim() and k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k, v must share their leading dims, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if enable_gqa and q.dim() >= 3 and q.shape[:-3] == k.shape[:-3] and q.size(-3) % k.size(-3) == 0:
        return  # (..., H, L, D) queries over (..., G, S, D) keys, G dividing H
    if q.shape[:-2] != k.shape[:-2]:
        grouped = " (with enable_gqa, k's heads must divide q's)" if enable_gqa else ""
        raise ValueError(f"q, k, v must share their leading dims{grouped}, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")


def _check_broadcast(name: str, t: Tensor, target: tuple[int, ...]) -> None:
    # By hand: torch.broadcast_shapes runs Python reference code, a cost paid per layer per token.
    if t.dim() > len(target):
        raise ValueError(f"{name} has {t.dim()} dims but the scores have {len(target)}: {tuple(t.shape)} vs {target}")
    if any(a != 1 and a != b for a, b in zip(reversed(t.shape), reversed(target))):
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to the scores' shape {target}")


def _allowed(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor | None:
    """The combined bool mask (broadcastable to (..., L, S)), or None when all is allowed."""
    allowed = mask
    if is_causal:
        causal = causal_mask(q.size(-2), k.size(-2), device=q.device)  # (L, S)
        allowed = causal if allowed is None else allowed & causal
    return allowed


SDPA_GQA = torch.__version__ >= "2.5"  # F.scaled_dot_product_attention(..., enable_gqa=) exists


def repeat_kv(q: Tensor, t: Tensor) -> Tensor:
    """Keys or values (..., G, S, D) -> (..., H, S, D): each of G heads serves H / G query heads (q: (..., H, L, D))."""
    if q.dim() < 3 or t.dim() < 3 or q.size(-3) == t.size(-3):
        return t
    return t.repeat_interleave(q.size(-3) // t.size(-3), dim=-3)


def sdpa(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention`` with grouped heads: native ``enable_gqa`` (torch ≥ 2.5) or repeated K/V."""
    if q.dim() < 3 or k.size(-3) == q.size(-3):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    return F.scaled_dot_product_attention(q, repeat_kv(q, k), repeat_kv(q, v), **kwargs)


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, scale: float, dropout_p: float,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The spec's formula line by line: softmax(Q Kᵀ · scale [soft-capped] + bias, masked) V. Returns (out, weights).

    ``softcap``: scores ← cap · tanh(scores / cap) before bias and mask (Gemma 2's attn_logit_softcapping).
    """
    k, v = repeat_kv(q, k), repeat_kv(q, v)  # grouped heads: (..., G, S, D) -> (..., H, S, D)
    scores = q @ k.transpose(-2, -1) * scale  # (..., L, S)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    # A row with no key left would be softmax(-inf, …) = NaN; such a query gets zero weights
    # (and, below, a zero output), forward and backward.
    row_ok = (scores > float("-inf")).any(dim=-1, keepdim=True)  # (..., L, 1)
    scores = torch.where(row_ok, scores, torch.zeros_like(scores))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype) * row_ok  # each live row sums to 1
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights  # (..., L, Dv), (..., L, S)


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, scale: float, dropout_p: float
) -> Tensor:
    """The same answer through ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels)."""
    if allowed is None:
        return sdpa(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return attend_prepared(q, k, v, prepare_mask(allowed, q.dtype), bias, scale, dropout_p)


def attend_prepared(q: Tensor, k: Tensor, v: Tensor, mask: PreparedMask, bias: Tensor | None, scale: float,
                    dropout_p: float) -> Tensor:
    """The fused path under a prepared mask (``qkv.masks.prepare_mask``): kernels disagree on rows with
    no allowed key (NaN or garbage), so such rows are opened to every key and their output zeroed;
    the multiplication keeps their gradient exactly zero."""
    attn_mask = mask.bias if mask.bias.dtype == q.dtype else mask.bias.to(q.dtype)  # autocast: q may be bf16
    attn_mask = attn_mask if bias is None else attn_mask + bias
    if q.size(-2) == 1 and dropout_p == 0.0 and torch.compiler.is_compiling():
        out = one_query_attention(q, k, v, attn_mask, scale)
    else:
        out = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return out if mask.live is None else out * mask.live


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor, scale: float) -> Tensor:
    """softmax(q Kᵀ · scale + attn_mask) V for one query per head, q (..., H, 1, D), written out for
    ``torch.compile``: inductor fuses it into a few loops over the keys, where the fused kernel's
    call costs more than one decoded token's attention.
    ``attn_mask`` is additive with a finite entry in each row (``prepare_mask`` opens empty rows)."""
    k, v = repeat_kv(q, k), repeat_kv(q, v)  # (..., G, S, D) -> (..., H, S, D); inductor indexes, never copies
    scores = q @ k.transpose(-2, -1) * scale + attn_mask  # (..., H, 1, S)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v  # (..., H, 1, D)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    enable_gqa: bool = False,
    softcap: float | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ · scale + bias, masked) · V, with scale = 1/√d_k by default.

    Args:
        q: (..., L, D) queries; k: (..., S, D) keys; v: (..., S, Dv) values.
        mask: bool, broadcastable to (..., L, S); True where a query may attend.
        bias: float, broadcastable to (..., L, S); added to the scores (ALiBi, relative bias).
        is_causal: add a causal mask aligned bottom-right (query i sees keys ≤ S − L + i).
        scale: score multiplier; 1/√D when None.
        dropout_p: dropout on the weights (pass 0.0 at evaluation).
        return_weights: also return the (..., L, S) weights; this takes the reference path.
        enable_gqa: k and v may have G heads where q has H (G divides H; grouped-query attention),
            (..., H, L, D) over (..., G, S, D), without copying K and V per query head.
        softcap: scores ← softcap · tanh(scores / softcap) before bias and mask (Gemma 2); the reference
            path computes it (the fused kernels cannot).
    Returns:
        out (..., L, Dv) [, weights (..., L, S)]. A query with no allowed key gets zeros.
    """
    _check_qkv(q, k, v, enable_gqa)
    check_mask(mask, bias, (*q.shape[:-1], k.size(-2)))
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    check_softcap("softcap", softcap)
    return attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                  return_weights=return_weights, softcap=softcap)


def check_mask(mask: Tensor | None, bias: Tensor | None, scores_shape: tuple[int, ...]) -> None:
    """mask must be bool and bias floating point, each broadcastable to the scores' shape (..., L, S)."""
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a bool Tensor (True = may attend), got {got}; pass float masks as bias=")
        _check_broadcast("mask", mask, scores_shape)
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point Tensor, got {got}")
        _check_broadcast("bias", bias, scores_shape)


def attend(
    q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, bias: Tensor | None = None,
    is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0, return_weights: bool = False,
    softcap: float | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``scaled_dot_product_attention`` without its argument checks, for callers that built q, k, v
    themselves (``MultiHeadAttention``: checks cost more than the work when decoding one token).
    ``mask`` may also be a ``PreparedMask`` (not combined with ``is_causal``).
    A ``softcap`` takes the reference path: no fused kernel computes it, and no fast path may change an answer."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    bias = None if bias is None else bias.to(q.dtype)
    reference = return_weights or softcap is not None
    if isinstance(mask, PreparedMask):
        if is_causal:
            raise ValueError("a PreparedMask already holds the causal mask: pass is_causal=False")
        if not reference:
            return attend_prepared(q, k, v, mask, bias, scale, dropout_p)
        mask = mask.allowed
    allowed = _allowed(q, k, mask, is_causal)
    if reference:
        out, weights = reference_attention(q, k, v, allowed, bias, scale, dropout_p, softcap)
        return (out, weights) if return_weights else out
    if is_causal and mask is None and bias is None and q.size(-2) == k.size(-2):
        # Square causal: top-left == bottom-right, so the kernel's own is_causal (flash) is exact.
        return sdpa(q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale)
    return fused_attention(q, k, v, allowed, bias, scale, dropout_p)


def projection_biases(bias: bool | Sequence[bool]) -> tuple[bool, bool, bool, bool]:
    """``bias`` for the q, k, v and output projections: one bool for all four, or four bools
    (Qwen2 biases q, k and v but not the output)."""
    if isinstance(bias, bool):
        return (bias,) * 4
    if isinstance(bias, Sequence) and len(bias) == 4 and all(isinstance(b, bool) for b in bias):
        return tuple(bias)
    raise TypeError(f"bias must be a bool or four bools (q, k, v, out), got {bias!r}")


def ring_mask(cache: RingKVCache, mask, is_causal: bool, q_len: int, k_len: int, input_pos: Tensor | None = None):
    """(mask, is_causal) over a ring cache's keys, from a mask over the full key axis (a sliding-window mask,
    whose columns the ring drops are False); without a mask, the causal window itself.
    ``update``'s keys are the span of the key axis the cache says; ``write``'s (static slots ``input_pos``) are
    at ``cache.key_places``, a tensor: each query keeps the written keys of its causal window there."""
    if input_pos is not None:
        places = cache.key_places(input_pos)  # (K,), or (B, K) for per-row input_pos (B, L)
        keep = (places >= 0).unsqueeze(-2) & causal_mask_at(input_pos, places) & within_window(input_pos, places, cache.window)
        return select_keys(mask, places, keep), False  # keep: (L, K) or (B, L, K)
    if mask is None and is_causal:
        return sliding_window_mask(q_len, k_len, cache.window, device=cache.k.device), False  # (L, K + L)
    return crop_keys(mask, *cache.span), is_causal


class SelfAttention(nn.Module):
    """The spec's chapter-1 module: one head over the full width, Q = X W_Q, K = X W_K, V = X W_V."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        self.d_model = d_model
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, is_causal: bool = False, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (..., T, C) -> out (..., T, C) [, weights (..., T, T)]."""
        if x.dim() < 2 or x.size(-1) != self.d_model:
            raise ValueError(f"expected x of shape (..., T, {self.d_model}), got {tuple(x.shape)}")
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (..., T, C) each
        return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, return_weights=return_weights)


def check_head_sizes(d_model: int, num_heads: int, num_kv_heads: int, kv_dim: int, head_dim: int | None) -> None:
    """Positive widths; H divides d_model unless D is given; G divides H."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("kv_dim", kv_dim)):
        check_positive_int(name, value)
    check_positive_int("head_dim", head_dim, optional=True)
    if head_dim is None and d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}) (or give head_dim)")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017 §3.2.2) with grouped-query heads (Ainslie et al. 2023).

    Self-attention when ``context`` is None; cross-attention (Q from x, K and V from
    context) otherwise. ``num_kv_heads`` < ``num_heads`` shares each K/V head among
    num_heads / num_kv_heads query heads (1 = multi-query). Position enters through the
    optional ``rope`` (rotates q and k), ``alibi`` or ``relative_bias`` (bias the scores: ``qkv.ALiBi``,
    ``qkv.nn.relative_bias.T5RelativePositionBias``; each called (L, S, positions=) -> bias) modules.
    ``kv_dim`` is the context's width when it differs from d_model (cross-attention).
    Decoding against a fixed source: ``project_kv(context)`` once, then ``context_kv=`` per step.
    ``q_norm`` / ``k_norm``: QK-norm, a norm over each head's D dims of q and of k, before RoPE (Qwen3,
    Gemma 3; Hugging Face's weight names). ``scale``: the scores' multiplier (None: D^-½; Gemma:
    query_pre_attn_scalar^-½). ``softcap``: scores ← softcap · tanh(scores / softcap) (Gemma 2).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool | Sequence[bool] = False,
        dropout: float = 0.0,
        rope: nn.Module | None = None,
        alibi: nn.Module | None = None,
        relative_bias: nn.Module | None = None,
        kv_dim: int | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        kv_dim = d_model if kv_dim is None else kv_dim
        check_head_sizes(d_model, num_heads, num_kv_heads, kv_dim, head_dim)
        check_fraction("dropout", dropout)
        self.d_model, self.num_heads, self.num_kv_heads, self.kv_dim = d_model, num_heads, num_kv_heads, kv_dim
        self.head_dim = d_model // num_heads if head_dim is None else head_dim  # D
        if rope is not None and getattr(rope, "head_dim", self.head_dim) != self.head_dim:
            raise ValueError(f"rope.head_dim must equal the attention's head_dim = {self.head_dim}, got {rope.head_dim}")
        for name, module in (("alibi", alibi), ("relative_bias", relative_bias)):
            if module is not None and getattr(module, "num_heads", num_heads) != num_heads:
                raise ValueError(f"{name}.num_heads must equal num_heads = {num_heads}, got {module.num_heads}")
        if alibi is not None and relative_bias is not None:
            raise ValueError("pass alibi or relative_bias (one score bias), not both")
        q_bias, k_bias, v_bias, out_bias = projection_biases(bias)
        width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim  # H·D, G·D
        self.q_proj = nn.Linear(d_model, width, bias=q_bias)
        self.k_proj = nn.Linear(kv_dim, kv_width, bias=k_bias)
        self.v_proj = nn.Linear(kv_dim, kv_width, bias=v_bias)
        self.out_proj = nn.Linear(width, d_model, bias=out_bias)
        self.dropout = dropout
        self.rope, self.alibi, self.relative_bias = rope, alibi, relative_bias
        self.set_variants(q_norm, k_norm, scale, softcap)

    def set_variants(self, q_norm: nn.Module | None, k_norm: nn.Module | None, scale: float | None,
                     softcap: float | None) -> None:
        """QK-norm's two norms (each over one head's D dims, or a ``ProjectionRMSNorm`` over all of q's H·D and
        k's G·D), the scores' scale and soft cap, checked."""
        for name, norm, heads in (("q_norm", q_norm, self.num_heads), ("k_norm", k_norm, self.num_kv_heads)):
            width = None if norm is None else getattr(norm, "normalized_shape", getattr(norm, "weight", None))
            width = tuple(width.shape) if isinstance(width, Tensor) else None if width is None else tuple(width)
            whole = isinstance(norm, ProjectionRMSNorm)
            if norm is not None and width != ((heads if whole else 1) * self.head_dim,):
                what = f"all {heads} × {self.head_dim} dims of its projection" if whole else \
                    f"one head's {self.head_dim} dims"
                raise ValueError(f"{name} must normalise {what} (heads of one width D = {self.head_dim}), got a norm "
                                 f"over {width}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
            raise ValueError(f"scale must be a positive number or None (1/√D), got {scale!r}")
        check_softcap("softcap", softcap)
        self.q_norm, self.k_norm, self.scale, self.softcap = q_norm, k_norm, scale, softcap

    def split_heads(self, t: Tensor, n: int) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n·D) -> (B, n, T, D)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """context (B, S, kv_dim) -> keys, values (B, G, S, D) each, not rotated.

        Project a source once and attend over it at every decoding step with ``context_kv=``
        (cross-attention; RoPE, which would rotate the keys, is refused there).
        """
        self._check_context(context)
        k, v = self.k_proj(context), self.v_proj(context)  # (B, S, G·D) each
        k = self.split_heads(k, self.num_kv_heads)  # (B, G, S, D)
        return (k if self.k_norm is None else self.k_norm(k)), self.split_heads(v, self.num_kv_heads)  # (B, G, S, D)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        context_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        kv_cache=None,
        input_pos: Tensor | None = None,
        return_weights: bool = False,
        rope_positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, L, C) [, context (B, S, kv_dim)] -> out (B, L, C) [, weights (B, H, L, S)].

        ``context_kv``: the context's keys and values from ``project_kv``, instead of ``context``.
        ``mask`` is bool, True = may attend, broadcastable to (B, H, L, S) where S counts
        cached keys too; or a ``qkv.masks.PreparedMask`` (the models prepare one per forward).
        ``kv_cache`` (a ``qkv.KVCache``) receives this call's keys and values and supplies all
        keys so far; positions continue from ``kv_cache.pos``.
        With ``input_pos`` (L,), the cache *slots* x's tokens go to, the cache is static: keys
        are the whole cache (S = its capacity) and ``mask`` must hide the slots not yet written.
        ``rope_positions`` (L,) or (B, L): x's real positions (left padding not counted), where RoPE rotates
        when its table follows the length (``RotaryEmbedding.places``).
        """
        self._check(x, context, context_kv, kv_cache, input_pos)
        q, k, v = self.project_qkv(x, context, context_kv)  # (B, H, L, D), (B, G, S, D), (B, G, S, D)
        # x's positions on the key axis: static slots, or continuing the cache (RoPE is relative)
        positions = input_pos if input_pos is not None else 0 if kv_cache is None else kv_cache.pos
        if self.rope is not None:
            places = self.rope.places(positions, rope_positions)
            q, k = self.rope(q, places), self.rope(k, places)
        if input_pos is not None:
            k, v = kv_cache.write(input_pos, k, v)  # (B, G, M, D): the whole static cache
        elif kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, G, pos + L, D)
        if isinstance(kv_cache, RingKVCache):
            mask, is_causal = ring_mask(kv_cache, mask, is_causal, q.size(-2), k.size(-2), input_pos)
        out, weights = self.attend_heads(q, k, v, mask=mask, is_causal=is_causal, positions=input_pos,
                                    return_weights=return_weights)
        out = out.transpose(1, 2).reshape(x.size(0), x.size(1), -1)  # (B, H, L, D) -> (B, L, H·D)
        out = self.out_proj(out)
        return (out, weights) if return_weights else out

    def project_qkv(self, x: Tensor, context: Tensor | None, context_kv) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, L, D) from x; keys and values (B, G, S, D) from context, context_kv or x, QK-normed, not
        rotated. (With ``attend_heads``, a step a speed-layer subclass may compute otherwise: ``qkv.kernels``.)"""
        q = self.split_heads(self.q_proj(x), self.num_heads)  # (B, H, L, D)
        q = q if self.q_norm is None else self.q_norm(q)  # QK-norm: over each head's D, before RoPE
        k, v = self.project_kv(x if context is None else context) if context_kv is None else context_kv
        return q, k, v

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool,
                     positions: Tensor | None, return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """q (B, H, L, D) over k, v (B, G, S, D) -> out (B, H, L, D), weights (B, H, L, S) or None."""
        scores_bias = self.alibi if self.relative_bias is None else self.relative_bias
        bias = None if scores_bias is None else scores_bias(q.size(-2), k.size(-2), positions=positions)  # (…, L, S)
        dropout_p = self.dropout if self.training else 0.0
        if not isinstance(mask, PreparedMask):  # q, k, v are ours; the mask is the caller's
            check_mask(mask, None, (*q.shape[:-1], k.size(-2)))
        res = attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=self.scale, dropout_p=dropout_p,
                     return_weights=return_weights, softcap=self.softcap)  # G < H: each K/V head serves H / G query heads, uncopied
        return res if return_weights else (res, None)

    def _check_context(self, context: Tensor) -> None:
        if not isinstance(context, Tensor) or context.dim() != 3 or context.size(-1) != self.kv_dim:
            shape = tuple(context.shape) if isinstance(context, Tensor) else type(context).__name__
            raise ValueError(f"expected context of shape (B, S, {self.kv_dim}), got {shape}")

    def _check(self, x: Tensor, context: Tensor | None, context_kv, kv_cache, input_pos) -> None:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"expected x of shape (B, T, {self.d_model}), got {shape}")
        if context is not None:
            self._check_context(context)
            if context.size(0) != x.size(0):
                raise ValueError(f"context batch {context.size(0)} differs from x batch {x.size(0)}")
        elif context_kv is None and self.kv_dim != self.d_model:
            raise ValueError(f"this attention takes keys of width kv_dim={self.kv_dim}: pass a context")
        if context_kv is not None:
            self._check_context_kv(context_kv, x, context)
        if kv_cache is not None and (context is not None or context_kv is not None):
            raise ValueError("kv_cache is for self-attention; cross-attention keys come from context")
        if input_pos is not None and kv_cache is None:
            raise ValueError("input_pos places tokens in a static KV cache: pass kv_cache too")

    def _check_context_kv(self, context_kv, x: Tensor, context: Tensor | None) -> None:
        if context is not None:
            raise ValueError("pass context or its projected context_kv, not both")
        if self.rope is not None:
            raise ValueError("context_kv holds unrotated keys: it cannot be used with rope")
        pair = isinstance(context_kv, (tuple, list)) and len(context_kv) == 2
        k, v = context_kv if pair else (None, None)
        want = (x.size(0), self.num_kv_heads, self.head_dim)  # (B, G, D)
        if not (isinstance(k, Tensor) and isinstance(v, Tensor) and k.dim() == 4 and k.shape == v.shape
                and (k.size(0), k.size(1), k.size(3)) == want):
            got = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__ for t in context_kv] \
                if isinstance(context_kv, (tuple, list)) else type(context_kv).__name__
            raise ValueError(f"context_kv must be (k, v) from project_kv, each (B, G, S, D) with (B, G, D) = {want}, "
                             f"got {got}")
