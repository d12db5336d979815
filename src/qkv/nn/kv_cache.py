"""A preallocated key/value cache for one attention layer (after gpt-fast and torchtune).

Shapes: B batch, G key/value heads, M capacity (max_len), S source length, D head width.
Position tracking: ``pos`` counts the tokens written so far; the next ``update`` writes
rows pos … pos+T−1 and returns keys/values 0 … pos+T−1. Nothing is reallocated per token.
``write`` is the static form (gpt-fast's): explicit slots ``input_pos`` in, the full buffers
out. Slots are places in the buffers, not token positions (left padding makes them differ).
Slots (T,) are every row's; slots (B, T) are each row's own (continuous batching: rows of different
lengths decode together, each writing at its own end). ``rows`` views some rows, sharing the buffers.
``reorder`` and ``reorder_kv`` follow beam search's choice of rows.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..checks import check_positive_int


def _check_indices(indices: Tensor, batch: int | None = None) -> None:
    integer = isinstance(indices, Tensor) and not indices.is_floating_point() and indices.dtype != torch.bool
    if not integer or indices.dim() != 1:
        got = f"{indices.dtype} {tuple(indices.shape)}" if isinstance(indices, Tensor) else type(indices).__name__
        raise ValueError(f"indices must be an integer tensor (B,) of batch rows, got {got}")
    if batch is not None and indices.numel() != batch:
        raise ValueError(f"indices must hold one row per cache row, B={batch}, got {indices.numel()}")


def reorder_kv(kv: Sequence[tuple[Tensor, Tensor]], indices: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Per layer (k, v), (B, G, S, D) each -> the same with batch rows ``indices`` (B',) taken, in that order.

    For cross-attention keys and values (``Transformer.cross_kv``); B' may differ from B
    (e.g. ``arange(B).repeat_interleave(beams)`` gives each source one row per beam).
    """
    _check_indices(indices)
    return [(k.index_select(0, indices), v.index_select(0, indices)) for k, v in kv]


def static_positions(slots: Tensor, input_pos: Tensor) -> Tensor:
    """Static cache: slots (B, M) True where real tokens are (being) written; new tokens at input_pos (T,), or
    (B, T) per row -> their absolute positions (B, T), counted over real tokens (left padding does not shift them)."""
    counts = (slots.long().cumsum(-1) - 1).clamp(min=0)  # (B, M): each slot's position
    return counts.index_select(1, input_pos) if input_pos.dim() == 1 else counts.gather(1, input_pos)  # (B, T)


class KVCache(nn.Module):
    """Keys and values of one layer, (B, G, M, D) each, filled left to right."""

    def __init__(self, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, *, dtype=None, device=None):
        super().__init__()
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            check_positive_int(name, value)
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_len = max_len
        self.pos = 0

    def reset(self) -> None:
        """Forget the contents (the buffers are reused, not reallocated)."""
        self.pos = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, G, T, D) at pos; return all keys and values so far, (B, G, pos+T, D)."""
        if k.shape != v.shape or k.dim() != 4 or k.shape[:2] != self.k.shape[:2] or k.size(-1) != self.k.size(-1):
            raise ValueError(
                f"expected k and v of shape (B={self.k.size(0)}, G={self.k.size(1)}, T, D={self.k.size(3)}), "
                f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: {self.pos} cached + {k.size(2)} new = {end} tokens > max_len={self.max_len}"
            )
        self.k[:, :, self.pos:end] = k
        self.v[:, :, self.pos:end] = v
        self.pos = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def write(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Static form, for compiled decoding: write k, v (B, G, T, D) at slots input_pos (T,), the same in every
        row, or (B, T), each row's own.

        Returns the whole buffers (B, G, M, D): shapes never change, so a compiled step never
        recompiles. The caller tracks positions and masks the slots not yet written.
        """
        if k.dtype != self.k.dtype:  # autocast may hand in a lower precision
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if input_pos.dim() == 2:  # row b's tokens to its slots input_pos[b]
            if input_pos.shape != (k.size(0), k.size(2)):
                raise ValueError(f"per-row input_pos must be (B={k.size(0)}, T={k.size(2)}), "
                                 f"got {tuple(input_pos.shape)}")
            index = input_pos[:, None, :, None].expand_as(k)  # (B, G, T, D)
            self.k.scatter_(2, index, k)
            self.v.scatter_(2, index, v)
        else:
            self.k.index_copy_(2, input_pos, k)
            self.v.index_copy_(2, input_pos, v)
        return self.k, self.v

    def rows(self, start: int, stop: int) -> "KVCache":
        """A cache over rows start … stop − 1 of this one, (stop − start, G, M, D), sharing its buffers: what is
        written through it lands here (a server's batch steps over its first n rows, a new row is filled alone)."""
        view = row_view(self, start, stop)  # k, v (stop − start, G, M, D)
        view.max_len, view.pos = self.max_len, 0
        return view

    def reorder(self, indices: Tensor) -> None:
        """Row b of the cache becomes old row ``indices[b]`` (B,), in place (beam search keeps its best rows)."""
        _check_indices(indices, self.k.size(0))
        n = self.pos or self.k.size(2)  # a growing cache moves its filled slots only; a static one, all of them
        self.k[:, :, :n] = self.k[:, :, :n].index_select(0, indices)  # (B, G, n, D)
        self.v[:, :, :n] = self.v[:, :, :n].index_select(0, indices)


class RingKVCache(nn.Module):
    """Keys and values of one sliding-window layer: only the last W tokens, (B, G, W, D) each, in a ring.

    A window of W keys (query p sees keys p − W < j ≤ p) needs, besides the new tokens, only the W − 1
    before them, whatever the length so far: memory stays constant as generation grows (Mistral's rolling
    buffer cache, Jiang et al. 2023 §2; Hugging Face's sliding-window cache layers).
    Token t sits in ring slot t mod W. Two forms, as ``KVCache`` (do not mix them without ``reset``):
    ``update(k, v)`` (T new tokens) counts its tokens in ``pos`` and returns the kept tokens and the new ones in
    order, (B, G, K + T, D), K = min(pos, W − 1): keys ``span`` = (pos − K, pos + T) of the full key axis, which
    ``qkv.masks.crop_keys`` cuts a mask over all keys down to.
    ``write(input_pos, k, v)`` is the static form: the slots ``input_pos`` (a tensor) alone decide where keys go
    and which place each returned key holds (``key_places``), with no Python-int state, so a compiled step
    reads nothing that changes between tokens.
    ``max_len``: the slots of the full key axis it stands in for (a static cache's capacity M, which the
    models' masks span); None: unbounded. It holds W tokens whatever ``max_len`` is.
    """

    def __init__(self, batch_size: int, num_kv_heads: int, window: int, head_dim: int, *,
                 max_len: int | None = None, dtype=None, device=None):
        super().__init__()
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                            ("window", window), ("head_dim", head_dim)):
            check_positive_int(name, value)
        check_positive_int("max_len", max_len, optional=True)
        self.max_len = max_len
        shape = (batch_size, num_kv_heads, window, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("ring", torch.arange(window, device=device), persistent=False)  # (W,) ring slots
        self.window = window
        self.pos = 0  # update's form: tokens seen so far (the next token's slot on the full key axis)
        self.span = (0, 0)  # update's form: the full key axis's [start, end) that the last update returned

    def reset(self) -> None:
        """Forget the contents (the buffers are reused, not reallocated)."""
        self.pos, self.span = 0, (0, 0)

    def check_kv(self, k: Tensor, v: Tensor) -> None:
        if k.shape != v.shape or k.dim() != 4 or k.shape[:2] != self.k.shape[:2] or k.size(-1) != self.k.size(-1):
            raise ValueError(
                f"expected k and v of shape (B={self.k.size(0)}, G={self.k.size(1)}, T, D={self.k.size(3)}), "
                f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (B, G, T, D); return the last K kept and the T new, (B, G, K + T, D), oldest first."""
        self.check_kv(k, v)
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        T, kept = k.size(2), min(self.pos, self.window - 1)
        old = torch.arange(self.pos - kept, self.pos, device=self.k.device) % self.window  # (K,) ring slots
        keys = torch.cat((self.k.index_select(2, old), k), dim=2)  # (B, G, K + T, D), oldest first
        values = torch.cat((self.v.index_select(2, old), v), dim=2)
        self.store(torch.arange(self.pos, self.pos + T, device=self.k.device), k, v)
        self.span, self.pos = (self.pos - kept, self.pos + T), self.pos + T
        return keys, values

    def store(self, places: Tensor, k: Tensor, v: Tensor) -> None:
        """Tokens at places (T,), or (B, T) each row's own, of the full key axis into their ring slots, k, v
        (B, G, T, D): only the last W, which are all a later query can see (no slot is written twice in one copy)."""
        T = k.size(2)
        n = min(T, self.window)
        slots = places[..., T - n:] % self.window  # (n,) or (B, n)
        if slots.dim() == 1:
            self.k.index_copy_(2, slots, k[:, :, T - n:])
            self.v.index_copy_(2, slots, v[:, :, T - n:])
            return
        index = slots[:, None, :, None].expand(-1, k.size(1), -1, k.size(3))  # (B, G, n, D)
        self.k.scatter_(2, index, k[:, :, T - n:])
        self.v.scatter_(2, index, v[:, :, T - n:])

    def write(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Static form: k, v (B, G, T, D) at consecutive slots input_pos (T,), or (B, T) each row's own (continuous
        batching), every slot before them written earlier (or none: a prefill from slot 0). Returns the keys and
        values the T queries attend over, each key at the place ``key_places(input_pos)`` says (per row for (B, T)):
        T = 1: the ring after the write, (B, G, W, D), uncopied (what a decoded token needs);
        T > 1: the ring before the write, then the T new, (B, G, W + T, D) (a later token of a chunk may
        overwrite a key an earlier one still sees)."""
        self.check_kv(k, v)
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        B, T = k.size(0), k.size(2)
        if input_pos.shape not in ((T,), (B, T)):
            raise ValueError(f"input_pos must be (T={T},) slots or (B={B}, T={T}) per row, "
                             f"got {tuple(input_pos.shape)}")
        if T == 1:
            self.store(input_pos, k, v)
            return self.k, self.v
        if not torch.compiler.is_compiling() and not bool((input_pos.diff() == 1).all()):
            raise ValueError(f"a ring KV cache takes consecutive slots, got {input_pos.tolist()}")
        keys, values = torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2)  # (B, G, W + T, D)
        self.store(input_pos, k, v)
        return keys, values

    def key_places(self, input_pos: Tensor) -> Tensor:
        """The place on the full key axis of each key ``write(input_pos, …)`` returns, (W,) or (W + T,), or per
        row (B, W) or (B, W + T) for input_pos (B, T); < 0 where a ring slot holds nothing yet. Ring slot s holds
        the latest place ≡ s (mod W) written so far."""
        T = input_pos.size(-1)
        last = input_pos[..., -1:] if T == 1 else input_pos[..., :1] - 1  # (1,) or (B, 1): the ring's newest place
        places = last - (last - self.ring) % self.window  # (W,) or (B, W)
        return places if T == 1 else torch.cat((places, input_pos), dim=-1)  # (…, W) or (…, W + T)

    def rows(self, start: int, stop: int) -> "RingKVCache":
        """A ring over rows start … stop − 1 of this one, (stop − start, G, W, D), sharing its buffers (as
        ``KVCache.rows``: a server's batch steps over its first n rows, a new row is filled alone)."""
        view = row_view(self, start, stop)  # k, v (stop − start, G, W, D)
        view.register_buffer("ring", self.ring, persistent=False)
        view.max_len, view.window, view.pos, view.span = self.max_len, self.window, 0, (0, 0)
        return view

    def reorder(self, indices: Tensor) -> None:
        """Row b of the cache becomes old row ``indices[b]`` (B,), in place (beam search keeps its best rows)."""
        _check_indices(indices, self.k.size(0))
        self.k.copy_(self.k.index_select(0, indices))  # (B, G, W, D)
        self.v.copy_(self.v.index_select(0, indices))


def row_view(cache: nn.Module, start: int, stop: int) -> nn.Module:
    """A bare module of ``cache``'s class whose buffers k and v are rows start … stop − 1 of its own (views:
    what is written through it lands in ``cache``); the caller sets the rest of its state."""
    if not 0 <= start < stop <= cache.k.size(0):
        raise ValueError(f"rows must satisfy 0 <= start < stop <= {cache.k.size(0)}, got {start}, {stop}")
    view = type(cache).__new__(type(cache))
    nn.Module.__init__(view)
    view.register_buffer("k", cache.k[start:stop], persistent=False)
    view.register_buffer("v", cache.v[start:stop], persistent=False)
    return view
