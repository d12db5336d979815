"""FlashAttention as a readable reference: exact softmax attention, one tile at a time.

Dao et al. 2022, "FlashAttention" (arXiv:2205.14135), in the loop order of FlashAttention-2
(Dao 2023, Algorithm 1): the outer loop walks query blocks Q_i, the inner loop key/value
blocks K_j, V_j, and three running quantities per query row stand in for the (L, S) scores:

    S_ij = Q_i K_jᵀ · scale                        the scores of one tile
    m'   = max(m, rowmax(S_ij))                    running max (keeps exp from overflowing)
    P_ij = exp(S_ij − m')                          the tile's unnormalised weights
    l'   = e^(m − m') · l + rowsum(P_ij)           running softmax denominator
    O'   = e^(m − m') · O + P_ij V_j               accumulator, rescaled to the new max
    out_i = O / l                                  after the last key block

Live memory is O(L·Dv + Bq·Bk) per head instead of O(L·S). For reading and measuring; the
fast path is ``qkv.scaled_dot_product_attention``. Departure from the paper: autograd
differentiates the loop as written and keeps every tile for backward (the paper's backward
recomputes them), so only the forward pass has O(n) memory.

Shapes: "..." leading dims (B, H), L query length, S key length, D head width, Dv value
width, Bq and Bk the query and key block lengths (block_size, shorter at the end).
Masks: bool True = may attend, broadcastable to (..., L, S), as in ``qkv.scaled_dot_product_attention``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_positive_int
from .masks import causal_mask_at


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise unless q (..., L, D), k (..., S, D), v (..., S, Dv) are floating tensors with equal leading dims."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a floating-point Tensor, got {got}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., len, dim), got shape {tuple(t.shape)}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k must share their last dim, got {shapes}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v must have the same length, got {shapes}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading dims, got {shapes}")


def full_mask(mask: Tensor, scores_shape: tuple[int, ...]) -> Tensor:
    """The bool mask as a (..., L, S) view (stride 0 where it broadcasts, nothing copied), ready to slice."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool Tensor (True = may attend), got {got}")
    L, S = scores_shape[-2:]
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape {scores_shape}")
    mask = mask.reshape((1,) * max(0, 2 - mask.dim()) + tuple(mask.shape))  # at least (1, 1)
    return mask.expand(*mask.shape[:-2], L, S)  # (..., L, S)


def tile_mask(mask: Tensor | None, is_causal: bool, rows: range, cols: range, shift: int, device) -> Tensor | None:
    """Bool (..., Bq, Bk) for queries ``rows`` and keys ``cols``, or None; causal: key j ≤ query i + shift."""
    allowed = None if mask is None else mask[..., rows.start:rows.stop, cols.start:cols.stop]
    if is_causal and cols.stop - 1 > rows.start + shift:  # only tiles that cross the diagonal
        i = torch.arange(rows.start, rows.stop, device=device) + shift  # (Bq,): the queries' key positions
        causal = causal_mask_at(i, torch.arange(cols.start, cols.stop, device=device))  # (Bq, Bk)
        allowed = causal if allowed is None else allowed & causal
    return allowed


def query_block(
    q_i: Tensor, k: Tensor, v: Tensor, *, rows: range, mask: Tensor | None, is_causal: bool, shift: int,
    scale: float, block_size: int,
) -> Tensor:
    """out_i (..., Bq, Dv) for the block q_i (..., Bq, D) of queries ``rows``; query i sees keys ≤ i + shift."""
    S = k.size(-2)
    # Causal: this block's last query sees keys up to rows.stop − 1 + shift; key blocks that start
    # after that are hidden from every query of the block, so the loop skips them.
    last_key = min(S, rows.stop + shift) if is_causal else S
    m = q_i.new_full((*q_i.shape[:-1], 1), float("-inf"))  # (..., Bq, 1) running max
    l = q_i.new_zeros((*q_i.shape[:-1], 1))  # (..., Bq, 1) running denominator
    o = q_i.new_zeros((*q_i.shape[:-1], v.size(-1)))  # (..., Bq, Dv) accumulator
    for start in range(0, max(last_key, 0), block_size):
        cols = range(start, min(start + block_size, S))
        k_j, v_j = k[..., cols.start:cols.stop, :], v[..., cols.start:cols.stop, :]  # (..., Bk, D), (..., Bk, Dv)
        s = q_i @ k_j.transpose(-2, -1) * scale  # S_ij = Q_i K_jᵀ · scale: (..., Bq, Bk)
        allowed = tile_mask(mask, is_causal, rows, cols, shift, q_i.device)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        # m' = max(m, rowmax(S_ij)). out does not depend on m (it cancels in O / l), so no
        # gradient flows through it. A row with no allowed key yet keeps m' = −inf: subtract 0
        # instead, so that exp(−inf − 0) = 0 rather than exp(−inf + inf) = NaN.
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()  # (..., Bq, 1)
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp(s - m_safe)  # P_ij = exp(S_ij − m'): (..., Bq, Bk)
        alpha = torch.exp(m - m_safe)  # e^(m − m'), 0 while m = −inf
        l = alpha * l + p.sum(dim=-1, keepdim=True)  # l' = e^(m − m') l + rowsum(P_ij)
        o = alpha * o + p @ v_j  # O' = e^(m − m') O + P_ij V_j: (..., Bq, Dv)
        m = m_new
    # out_i = O / l. A query that saw no key has O = 0 and l = 0: divide by 1, output zeros.
    return o / torch.where(l > 0, l, torch.ones_like(l))


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 128,
) -> Tensor:
    """softmax(Q Kᵀ · scale, masked) · V computed tile by tile, never holding the (L, S) scores.

    Args:
        q: (..., L, D) queries; k: (..., S, D) keys; v: (..., S, Dv) values.
        mask: bool, broadcastable to (..., L, S); True where a query may attend.
        is_causal: add a causal mask aligned bottom-right (query i sees keys ≤ S − L + i).
        scale: score multiplier; 1/√D when None.
        block_size: rows per query block and per key block.
    Returns:
        out (..., L, Dv), equal to ``qkv.scaled_dot_product_attention``; a query with no allowed key gets zeros.
    """
    check_qkv(q, k, v)
    check_positive_int("block_size", block_size)
    L, S = q.size(-2), k.size(-2)
    acc = torch.promote_types(q.dtype, torch.float32)  # fp16/bf16 inputs accumulate in fp32
    dtype, q, k, v = q.dtype, q.to(acc), k.to(acc), v.to(acc)
    if mask is not None:
        mask = full_mask(mask, (*q.shape[:-1], S))  # (..., L, S) view
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    blocks = []
    for start in range(0, L, block_size):
        rows = range(start, min(start + block_size, L))
        q_i = q[..., rows.start:rows.stop, :]  # (..., Bq, D)
        blocks.append(query_block(q_i, k, v, rows=rows, mask=mask, is_causal=is_causal, shift=S - L,
                                  scale=scale, block_size=block_size))
    out = torch.cat(blocks, dim=-2) if blocks else q.new_zeros((*q.shape[:-1], v.size(-1)))  # (..., L, Dv)
    return out.to(dtype)
