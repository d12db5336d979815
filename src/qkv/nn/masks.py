"""The one mask convention of qkv, and its builders.

A boolean mask is True where a query *may* attend (the polarity of
``torch.nn.functional.scaled_dot_product_attention``); a float ``bias`` is added to
the scores. PyTorch's ``nn.MultiheadAttention`` uses the opposite polarity; only
``qkv.interop.torch_nn`` translates it.

Shapes: B batch, H heads, L query length, S key length.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def causal_mask(q_len: int, k_len: int | None = None, *, device=None) -> Tensor:
    """Bool (q_len, k_len) mask, True where query i may see key j, aligned bottom-right.

    With q_len queries over k_len keys, query i sees keys 0 … k_len − q_len + i: the
    last query is the newest token and sees every key. That is what cached decoding and
    chunked prefill need (PyTorch's ``is_causal`` aligns top-left instead; the two agree
    only when q_len == k_len).
    """
    k_len = q_len if k_len is None else k_len
    for name, value in (("q_len", q_len), ("k_len", k_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    i = torch.arange(q_len, device=device) + (k_len - q_len)  # (L,): query i sits at key position S − L + i
    return causal_mask_at(i, torch.arange(k_len, device=device))  # (L, S)


def causal_mask_at(query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """Bool (..., L, S), True where the key's position is at or before the query's: the causal rule itself,
    for queries and keys placed anywhere (a tile of FlashAttention, a static KV cache's slots)."""
    return key_positions.unsqueeze(-2) <= query_positions.unsqueeze(-1)  # (..., 1, S) vs (..., L, 1)


def sliding_window_mask(q_len: int, k_len: int | None = None, window: int = 1, *, device=None) -> Tensor:
    """Bool (q_len, k_len) causal mask within a window of ``window`` keys, aligned bottom-right.

    Query i, at key position p = k_len − q_len + i, sees keys p − window < j ≤ p: itself and the
    window − 1 before it (Mistral's and Gemma's ``sliding_window``; Hugging Face's
    ``sliding_window_causal``: ``kv_idx > q_idx − sliding_window`` on top of the causal mask).
    """
    k_len = q_len if k_len is None else k_len
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    allowed = causal_mask(q_len, k_len, device=device)  # (L, S); checks the lengths
    i = torch.arange(q_len, device=device) + (k_len - q_len)  # (L,)
    return allowed & within_window(i, torch.arange(k_len, device=device), window)  # (L, S)


def within_window(query_positions: Tensor, key_positions: Tensor, window: int) -> Tensor:
    """Bool (..., L, S), True where the key is less than ``window`` positions before the query (or after it:
    combine with ``causal_mask_at``): the sliding window's rule itself, for positions placed anywhere."""
    return key_positions.unsqueeze(-2) > query_positions.unsqueeze(-1) - window  # (..., 1, S) vs (..., L, 1)


def padding_mask(lengths_or_valid: Tensor, max_len: int | None = None) -> Tensor:
    """Bool (B, 1, 1, S) key mask, True on real tokens, from lengths or a validity mask.

    Args:
        lengths_or_valid: int (B,) sequence lengths (right padding), or bool (B, S)
            True on real tokens (any padding side, e.g. left padding for generation).
        max_len: S for lengths; defaults to the longest length. Ignored for a bool mask.
    Returns:
        (B, 1, 1, S) bool, broadcastable against (B, H, L, S) scores.
    """
    x = lengths_or_valid
    if not isinstance(x, Tensor):
        raise TypeError(f"padding_mask expects a Tensor, got {type(x).__name__}")
    if x.dtype == torch.bool:
        if x.dim() != 2:
            raise ValueError(f"a validity mask must be (B, S), got shape {tuple(x.shape)}")
        return x[:, None, None, :]  # (B, 1, 1, S)
    if x.is_floating_point() or x.is_complex() or x.dim() != 1:
        raise ValueError(
            f"lengths must be a 1-D integer tensor (B,), got dtype {x.dtype} shape {tuple(x.shape)}"
        )
    if x.numel() and int(x.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {x.tolist()}")
    longest = int(x.max()) if x.numel() else 0
    S = longest if max_len is None else max_len
    if S < longest:
        raise ValueError(f"max_len={S} is shorter than the longest length {longest}")
    valid = torch.arange(S, device=x.device) < x[:, None]  # (B, S)
    return valid[:, None, None, :]  # (B, 1, 1, S)


class PreparedMask(NamedTuple):
    """A bool mask converted once into the additive form the fused kernels take, for every layer of a forward.

    Per layer, the conversion (and finding rows with no key) costs more than the attention of one
    decoded token; a model prepares its masks once and hands the same one to each block.
    """

    allowed: Tensor  # bool (..., L, S), True where a query may attend (the reference path reads this)
    bias: Tensor  # float (..., L, S): 0 where allowed, -inf elsewhere; a row with no key is left all 0
    live: Tensor | None  # bool (..., L, 1): False on rows with no key (their output is zeroed); None: none such


def crop_keys(mask, start: int, end: int):
    """A mask over keys 0 … S−1 -> over keys start … end−1 only (bool, or a ``PreparedMask``; None stays None).

    A windowed KV cache (``qkv.kv_cache.RingKVCache``) returns only the keys a window can still see; the
    columns it drops are False in a sliding-window mask, so rows keep their live keys.
    """
    keys = None if mask is None else (mask.allowed if isinstance(mask, PreparedMask) else mask).shape[-1]
    if mask is None or keys == 1 or (start == 0 and end == keys):
        return mask  # no mask, one broadcast over the keys, or already these keys
    if isinstance(mask, PreparedMask):
        return PreparedMask(mask.allowed[..., start:end], mask.bias[..., start:end], mask.live)
    return mask[..., start:end]


def select_keys(mask, places: Tensor, keep: Tensor):
    """A mask over keys 0 … S−1 -> over the keys at ``places`` (K,) (a ring cache's slots, in its order), and
    only where ``keep`` (L, K) is True (bool, or a ``PreparedMask``; None gives ``keep`` itself). Per row:
    places (B, K), keep (B, L, K), the mask (B, 1, L, S) or (B, 1, 1, S).

    ``keep`` must hold each query's own key (a ring's keys: written, causal, in the window), so no row of the
    bias is all −inf; a ``PreparedMask``'s rows without keys stay zeroed by its ``live``.
    """
    index = places.clamp(min=0)  # (K,) or (B, K): a place < 0 (nothing written) reads column 0, keep drops it
    if places.dim() == 2:
        keep = keep[:, None]  # (B, L, K) -> (B, 1, L, K)

    def select(t: Tensor) -> Tensor:
        if t.size(-1) == 1:
            return t
        if index.dim() == 1:
            return t.index_select(-1, index)  # (..., L, K)
        rows = index[:, None, None, :].expand(t.size(0), t.size(1), t.size(2), -1)  # (B, h, L, K)
        return t.gather(-1, rows)  # (B, h, L, K)

    if mask is None:
        return keep
    if isinstance(mask, PreparedMask):
        return PreparedMask(select(mask.allowed) & keep, select(mask.bias).masked_fill(~keep, float("-inf")),
                            mask.live)
    return select(mask) & keep


def prepare_mask(allowed: Tensor, dtype: torch.dtype = torch.float32) -> PreparedMask:
    """Bool mask (..., L, S), True = may attend -> ``PreparedMask`` with its bias in ``dtype``."""
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool or allowed.dim() < 2:
        got = f"{allowed.dtype} {tuple(allowed.shape)}" if isinstance(allowed, Tensor) else type(allowed).__name__
        raise TypeError(f"prepare_mask expects a bool mask (..., L, S), True = may attend, got {got}")
    live = allowed.any(dim=-1, keepdim=True)  # (..., L, 1)
    # Drop the zeroing when every row has a key: worth a sync on a CPU only (none when compiling).
    cheap_sync = allowed.device.type == "cpu" and not torch.compiler.is_compiling()
    everywhere = cheap_sync and bool(live.all())
    opened = allowed if everywhere else allowed | ~live  # kernels disagree on rows with no key: open them
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~opened, float("-inf"))
    return PreparedMask(allowed, bias, None if everywhere else live)
