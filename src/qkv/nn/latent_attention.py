"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3, arXiv 2412.19437 §2.1.1).

Keys and values of a token pass through one low-rank latent c_KV; position enters through a separate
RoPE key k_R that every head shares ("decoupled RoPE": RoPE between W_UK and the query would block
the absorption below).

    c_KV = RMSNorm(W_DKV h),  k_R = RoPE(W_KR h)           (eq. 9, 15)   kv_a_proj_with_mqa, kv_a_layernorm
    k_C,i = W_UK,i c_KV,  v_C,i = W_UV,i c_KV               (eq. 10, 11)  kv_b_proj
    c_Q = RMSNorm(W_DQ h),  [q_C,i; q_R,i] = W_UQ,i c_Q     (eq. 12, 13)  q_a_proj, q_a_layernorm, q_b_proj
                                                                          (or one q_proj from h)
    q_R,i ← RoPE(q_R,i)                                     (eq. 14)
    o_i = Σ_j softmax_j([q_C,i; q_R,i]ᵀ [k_C,j,i; k_R,j] · scale) v_C,j,i,  scale = (d_N + d_R)^−½  (eq. 16–18)
    u = W_O [o_1; …; o_H]                                   (eq. 19)      o_proj

Absorbed decoding (§2.1.2: W_UK is absorbed into the query, W_UV into the output):
    q_C,iᵀ k_C,j,i = (W_UK,iᵀ q_C,i)ᵀ c_KV,j        Σ_j w_ij v_C,j,i = W_UV,i Σ_j w_ij c_KV,j
so attention needs only c_KV and k_R per token: d_c + d_R numbers where multi-head attention caches 2·H·D.

Shapes: B batch, L query length, S key length (cached keys too), M cache capacity, C model width, H heads,
d_c kv_lora_rank, d_q q_lora_rank, d_N qk_nope_head_dim, d_R qk_rope_head_dim, d_K = d_N + d_R, d_V v_head_dim.
Masks: bool True = may attend, broadcastable to (B, H, L, S); causal masks align bottom-right (``qkv.masks``).
Beyond the equations: the RMSNorms after the latents c_Q and c_KV (the paper's §3.1.2, and the released models).
Weight names are Hugging Face's ``DeepseekV3Attention``'s, one to one.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_fraction, check_positive_int
from .attention import attend, check_mask
from .kv_cache import KVCache
from .layers import make_norm
from .masks import PreparedMask, causal_mask
from .positional import RotaryEmbedding
from .rope_scaling import RopeScaling, yarn_mscale

CACHE_MODES = ("naive", "absorbed")


def check_room(pos: int, new: int, max_len: int) -> int:
    """The end of a write of ``new`` tokens after ``pos`` cached ones; ValueError past the capacity."""
    end = pos + new
    if end > max_len:
        raise ValueError(f"KV cache overflow: {pos} cached + {new} new = {end} tokens > max_len={max_len}")
    return end


def buffer_bytes(module: nn.Module) -> int:
    """Bytes held by a module's buffers (a cache's whole preallocated capacity)."""
    return sum(b.numel() * b.element_size() for b in module.buffers())


class DecompressedKVCache(KVCache):
    """The naive path's cache, as Hugging Face's DeepseekV3Attention kept it in transformers 4 (5 caches the
    latents but expands them all at every step): per-head keys (B, H, M, d_K) and values (B, H, M, d_V), a
    ``KVCache`` whose values have their own width. H·(d_K + d_V) numbers per token."""

    def __init__(self, batch_size: int, num_heads: int, max_len: int, key_dim: int, value_dim: int, *,
                 dtype=None, device=None) -> None:
        super().__init__(batch_size, num_heads, max_len, key_dim, dtype=dtype, device=device)
        check_positive_int("value_dim", value_dim)
        self.register_buffer("v", torch.zeros(batch_size, num_heads, max_len, value_dim, dtype=dtype, device=device),
                             persistent=False)

    @property
    def nbytes(self) -> int:
        """B · M · H · (d_K + d_V) · dtype size."""
        return buffer_bytes(self)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k (B, H, T, d_K), v (B, H, T, d_V) at pos; return all so far, (B, H, pos+T, d_K / d_V)."""
        B, H, _, dk = self.k.shape
        dv = self.v.size(-1)
        if k.dim() != 4 or k.shape[:2] != (B, H) or k.size(-1) != dk or v.shape != (*k.shape[:3], dv):
            raise ValueError(f"expected k of shape (B={B}, H={H}, T, {dk}) and v (B={B}, H={H}, T, {dv}), "
                             f"got k {tuple(k.shape)} and v {tuple(v.shape)}")
        end = check_room(self.pos, k.size(2), self.max_len)
        self.k[:, :, self.pos:end] = k
        self.v[:, :, self.pos:end] = v
        self.pos = end
        return self.k[:, :, :end], self.v[:, :, :end]


class LatentCache(nn.Module):
    """The absorbed path's cache: per token the normalised latent c_KV (d_c) and the rotated shared key k_R
    (d_R), side by side in one buffer (B, 1, M, d_c + d_R): one key head, as in multi-query attention, whose
    first d_c dims are also the values. Position tracking as ``KVCache``: ``pos`` tokens written so far."""

    def __init__(self, batch_size: int, max_len: int, kv_lora_rank: int, qk_rope_head_dim: int, *,
                 dtype=None, device=None) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("kv_lora_rank", kv_lora_rank),
                            ("qk_rope_head_dim", qk_rope_head_dim)):
            check_positive_int(name, value)
        shape = (batch_size, 1, max_len, kv_lora_rank + qk_rope_head_dim)
        self.register_buffer("kv", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_len, self.kv_lora_rank, self.qk_rope_head_dim = max_len, kv_lora_rank, qk_rope_head_dim
        self.pos = 0

    @property
    def numbers_per_token(self) -> int:
        """d_c + d_R: what one token costs this layer's cache, per batch row."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def nbytes(self) -> int:
        """B · M · (d_c + d_R) · dtype size."""
        return buffer_bytes(self)

    def latent(self) -> Tensor:
        """The cached c_KV so far, (B, 1, pos, d_c)."""
        return self.kv[:, :, :self.pos, :self.kv_lora_rank]

    def k_rope(self) -> Tensor:
        """The cached rotated k_R so far, (B, 1, pos, d_R)."""
        return self.kv[:, :, :self.pos, self.kv_lora_rank:]

    def reset(self) -> None:
        """Forget the contents (the buffer is reused, not reallocated)."""
        self.pos = 0

    def joined(self, latent: Tensor, k_rope: Tensor) -> Tensor:
        """latent (B, 1, T, d_c), k_rope (B, 1, T, d_R) -> (B, 1, T, d_c + d_R), checked, in the cache's dtype."""
        B, _, _, width = self.kv.shape
        if (latent.dim() != 4 or latent.shape[:2] != (B, 1) or latent.size(-1) != self.kv_lora_rank
                or k_rope.shape != (*latent.shape[:3], self.qk_rope_head_dim)):
            raise ValueError(f"expected latent of shape (B={B}, 1, T, {self.kv_lora_rank}) and k_rope "
                             f"(B={B}, 1, T, {self.qk_rope_head_dim}), got {tuple(latent.shape)} and "
                             f"{tuple(k_rope.shape)}")
        return torch.cat((latent, k_rope), dim=-1).to(self.kv.dtype)  # (B, 1, T, d_c + d_R)

    def update(self, latent: Tensor, k_rope: Tensor) -> Tensor:
        """Write T tokens' latent and k_R at pos; return every cached token so far, (B, 1, pos+T, d_c + d_R)."""
        new = self.joined(latent, k_rope)
        end = check_room(self.pos, new.size(2), self.max_len)
        self.kv[:, :, self.pos:end] = new
        self.pos = end
        return self.kv[:, :, :end]

    def write(self, input_pos: Tensor, latent: Tensor, k_rope: Tensor) -> Tensor:
        """Static form (as ``KVCache.write``): write at slots input_pos (T,), the same in every row, or (B, T), each
        row's own (continuous batching); return the whole (B, 1, M, d_c + d_R)."""
        new = self.joined(latent, k_rope)  # (B, 1, T, d_c + d_R)
        if input_pos.dim() == 1:
            self.kv.index_copy_(2, input_pos, new)
            return self.kv
        if input_pos.shape != new.shape[::2]:
            raise ValueError(f"per-row input_pos must be (B={new.size(0)}, T={new.size(2)}), "
                             f"got {tuple(input_pos.shape)}")
        self.kv.scatter_(2, input_pos[:, None, :, None].expand_as(new), new)  # row b's tokens to its slots
        return self.kv

    def rows(self, start: int, stop: int) -> "LatentCache":
        """A cache over rows start … stop − 1 of this one, sharing its buffer (as ``KVCache.rows``)."""
        if not 0 <= start < stop <= self.kv.size(0):
            raise ValueError(f"rows must satisfy 0 <= start < stop <= {self.kv.size(0)}, got {start}, {stop}")
        view = LatentCache.__new__(LatentCache)
        nn.Module.__init__(view)
        view.register_buffer("kv", self.kv[start:stop], persistent=False)  # (stop − start, 1, M, d_c + d_R), a view
        view.max_len, view.kv_lora_rank, view.qk_rope_head_dim = self.max_len, self.kv_lora_rank, self.qk_rope_head_dim
        view.pos = 0
        return view

    def reorder(self, indices: Tensor) -> None:
        """Row b of the cache becomes old row ``indices[b]`` (B,), in place (beam search)."""
        B = self.kv.size(0)
        if not isinstance(indices, Tensor) or indices.dtype not in (torch.int32, torch.int64) or indices.shape != (B,):
            got = f"{indices.dtype} {tuple(indices.shape)}" if isinstance(indices, Tensor) else type(indices).__name__
            raise ValueError(f"indices must be an integer tensor (B={B},) of batch rows, got {got}")
        n = self.pos or self.max_len  # a growing cache moves its filled slots only; a static one, all of them
        self.kv[:, :, :n] = self.kv[:, :, :n].index_select(0, indices)


def fold_heads(t: Tensor, heads: int, q_len: int) -> Tensor:
    """A mask-like tensor (..., L, X) broadcastable to (B, H, L, X) -> the same for queries folded as
    (B, 1, H·L, X), head-major; as it is when one row serves every head and query (it broadcasts)."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))  # (b, h, l, X): b, h, l each 1 or B, H, L
    if t.size(1) == 1 and t.size(2) == 1:
        return t
    return t.expand(-1, heads, q_len, -1).reshape(t.size(0), 1, heads * q_len, t.size(-1))  # (b, 1, H·L, X)


def folded_mask(mask: Tensor | PreparedMask | None, is_causal: bool, heads: int, q_len: int, k_len: int,
                device) -> Tensor | PreparedMask | None:
    """The caller's mask and the causal rule, for H·L queries folded into one head (see ``fold_heads``)."""
    if isinstance(mask, PreparedMask):
        if is_causal:
            raise ValueError("a PreparedMask already holds the causal mask: pass is_causal=False")
        return PreparedMask(*(None if t is None else fold_heads(t, heads, q_len) for t in mask))
    allowed = mask
    if is_causal and q_len > 1:  # bottom-right: a single query is the newest token and sees every key
        causal = causal_mask(q_len, k_len, device=device)  # (L, S)
        allowed = causal if allowed is None else allowed & causal
    return None if allowed is None else fold_heads(allowed, heads, q_len)


def check_latent_sizes(**sizes) -> None:
    """Each size a positive int (q_lora_rank may be None: a plain q_proj); qk_rope_head_dim even."""
    for name, value in sizes.items():
        check_positive_int(name, value, optional=name == "q_lora_rank")
    rope = sizes["qk_rope_head_dim"]
    if rope % 2:
        raise ValueError(f"qk_rope_head_dim must be a positive even int (RoPE rotates pairs), got {rope!r}")


def latent_softmax_scale(qk_head_dim: int, scaling: RopeScaling | None = None, *, base: float | None = None) -> float:
    """The scores' multiplier: ``base`` ((d_N + d_R)^−½ when None), × mscale(s, mscale_all_dim)² where the RoPE
    scaling sets mscale_all_dim (YaRN as DeepSeek-V2/V3 use it: ``softmax_scale * mscale * mscale`` in their
    inference code, Hugging Face's ``yarn_apply_mscale``). With YaRN's cos/sin factor mscale(s, mscale) /
    mscale(s, mscale_all_dim) on q_R and k_R, the rotated part of each score ends × mscale(s, mscale)², the rest
    × mscale(s, mscale_all_dim)²."""
    scale = qk_head_dim ** -0.5 if base is None else float(base)
    if scaling is None or scaling.type == "default" or not scaling.mscale_all_dim:
        return scale
    return scale * yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def check_softmax_scale(softmax_scale) -> None:
    ok = isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool)
    if softmax_scale is not None and not (ok and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite float or None ((d_N + d_R)^-0.5), "
                         f"got {softmax_scale!r}")


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2 §2.1), with two decoding paths that give one answer.

    The cache chooses the path (``new_cache(mode=)``): none, or a ``DecompressedKVCache`` (or any ``KVCache``
    of the right widths): **naive**, per-head keys and values expanded from the latent and cached, as Hugging
    Face's transformers 4 did; a ``LatentCache``: **absorbed**, only c_KV and k_R cached, W_UK folded
    into the query and W_UV applied after the weighted sum (DeepSeek's inference code).

    Args:
        d_model: C. num_heads: H.
        kv_lora_rank: d_c. qk_rope_head_dim: d_R (even). qk_nope_head_dim: d_N. v_head_dim: d_V.
        q_lora_rank: d_q, the query's low-rank path (q_a_proj, q_a_layernorm, q_b_proj); None: one q_proj.
        softmax_scale: the score multiplier; None: (d_N + d_R)^−½. YaRN's correction multiplies it by
            mscale² (DeepSeek's ``softmax_scale * mscale * mscale``): ``latent_softmax_scale`` gives the product.
        bias: biases on q_a_proj, kv_a_proj_with_mqa and o_proj (Hugging Face's ``attention_bias``).
        dropout: on the attention weights. norm_eps: the two RMSNorms' epsilon (1e-6, as Hugging Face's).
        rope: a ``RotaryEmbedding(d_R)`` (interleaved as the checkpoint says); None: half-split, base 10 000.
            Hugging Face's interleaved RoPE also reorders the rotated dims to half-split, a permutation
            shared by q and k that no score sees; qkv's leaves them in place.
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int, qk_rope_head_dim: int,
                 qk_nope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None,
                 softmax_scale: float | None = None, bias: bool = False, dropout: float = 0.0,
                 norm_eps: float = 1e-6, rope: nn.Module | None = None) -> None:
        super().__init__()
        check_latent_sizes(d_model=d_model, num_heads=num_heads, kv_lora_rank=kv_lora_rank,
                           qk_rope_head_dim=qk_rope_head_dim, qk_nope_head_dim=qk_nope_head_dim,
                           v_head_dim=v_head_dim, q_lora_rank=q_lora_rank)
        check_softmax_scale(softmax_scale)
        check_fraction("dropout", dropout)
        rope = RotaryEmbedding(qk_rope_head_dim) if rope is None else rope
        if getattr(rope, "head_dim", None) != qk_rope_head_dim or getattr(rope, "rotary_dim", qk_rope_head_dim) \
                != qk_rope_head_dim:
            raise ValueError(f"rope must rotate all qk_rope_head_dim = {qk_rope_head_dim} dims, got head_dim "
                             f"{getattr(rope, 'head_dim', None)}, rotary_dim {getattr(rope, 'rotary_dim', None)}")
        self.d_model, self.num_heads, self.dropout, self.rope = d_model, num_heads, dropout, rope
        self.kv_lora_rank, self.q_lora_rank, self.v_head_dim = kv_lora_rank, q_lora_rank, v_head_dim
        self.qk_rope_head_dim, self.qk_nope_head_dim = qk_rope_head_dim, qk_nope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim  # d_K
        self.softmax_scale = self.qk_head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
        self.build_projections(bias, norm_eps)

    def build_projections(self, bias: bool, norm_eps: float) -> None:
        """The weights, named as Hugging Face's; the absent query path's are None, as there."""
        C, H, dc, dq = self.d_model, self.num_heads, self.kv_lora_rank, self.q_lora_rank
        low_rank = dq is not None
        self.q_proj = None if low_rank else nn.Linear(C, H * self.qk_head_dim, bias=False)  # W_UQ W_DQ in one
        self.q_a_proj = nn.Linear(C, dq, bias=bias) if low_rank else None  # W_DQ
        self.q_a_layernorm = make_norm("rmsnorm", dq, norm_eps) if low_rank else None
        self.q_b_proj = nn.Linear(dq, H * self.qk_head_dim, bias=False) if low_rank else None  # W_UQ (with W_QR)
        self.kv_a_proj_with_mqa = nn.Linear(C, dc + self.qk_rope_head_dim, bias=bias)  # W_DKV and W_KR
        self.kv_a_layernorm = make_norm("rmsnorm", dc, norm_eps)
        self.kv_b_proj = nn.Linear(dc, H * (self.qk_nope_head_dim + self.v_head_dim), bias=False)  # W_UK, W_UV
        self.o_proj = nn.Linear(H * self.v_head_dim, C, bias=bias)  # W_O

    def new_cache(self, batch_size: int, max_len: int, *, mode: str = "absorbed", dtype=None,
                  device=None) -> KVCache | LatentCache:
        """An empty cache for this layer: ``mode`` "absorbed" a ``LatentCache`` (d_c + d_R numbers per token),
        "naive" a ``DecompressedKVCache`` (H·(d_K + d_V)). dtype and device default to the weights'."""
        weight = self.kv_b_proj.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        if mode == "absorbed":
            return LatentCache(batch_size, max_len, self.kv_lora_rank, self.qk_rope_head_dim, dtype=dtype,
                               device=device)
        if mode == "naive":
            return DecompressedKVCache(batch_size, self.num_heads, max_len, self.qk_head_dim, self.v_head_dim,
                                       dtype=dtype, device=device)
        raise ValueError(f"mode must be one of {CACHE_MODES}, got {mode!r}")

    def forward(self, x: Tensor, *, mask: Tensor | PreparedMask | None = None, is_causal: bool = False,
                kv_cache: KVCache | LatentCache | None = None, input_pos: Tensor | None = None,
                return_weights: bool = False, rope_positions: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, L, C) -> out (B, L, C) [, weights (B, H, L, S)]; called as ``MultiHeadAttention`` is.

        ``mask``: bool, True = may attend, broadcastable to (B, H, L, S), S counting cached keys; or a
        ``PreparedMask``. ``kv_cache`` (from ``new_cache``) receives this call's tokens and supplies all so
        far; positions continue from ``kv_cache.pos``. ``input_pos`` (L,): static cache slots, as MHA's.
        """
        self.check_inputs(x, kv_cache, input_pos)
        positions = input_pos if input_pos is not None else 0 if kv_cache is None else kv_cache.pos
        positions = self.rope.places(positions, rope_positions)  # the real ones where the table follows the length
        q_nope, q_rope = self.queries(x, positions)  # (B, H, L, d_N), (B, H, L, d_R)
        latent, k_rope = self.latent(x, positions)  # (B, 1, L, d_c), (B, 1, L, d_R)
        attend_path = self.attend_absorbed if isinstance(kv_cache, LatentCache) else self.attend_naive
        out, weights = attend_path(q_nope, q_rope, latent, k_rope, kv_cache, input_pos, mask=mask,
                                   is_causal=is_causal, return_weights=return_weights)  # (B, H, L, d_V)
        out = self.o_proj(out.transpose(1, 2).reshape(x.size(0), x.size(1), -1))  # (B, L, H·d_V) -> (B, L, C)
        return (out, weights) if return_weights else out

    def queries(self, x: Tensor, positions: Tensor | int) -> tuple[Tensor, Tensor]:
        """x (B, L, C) -> q_C (B, H, L, d_N) and the rotated q_R (B, H, L, d_R) (eq. 12–14)."""
        B, L, _ = x.shape
        if self.q_proj is not None:
            q = self.q_proj(x)  # (B, L, H·d_K)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (B, L, d_q) -> (B, L, H·d_K)
        q = q.view(B, L, self.num_heads, self.qk_head_dim).transpose(1, 2)  # (B, H, L, d_K)
        q_nope, q_rope = q.split((self.qk_nope_head_dim, self.qk_rope_head_dim), dim=-1)
        return q_nope, self.rope(q_rope, positions)

    def latent(self, x: Tensor, positions: Tensor | int) -> tuple[Tensor, Tensor]:
        """x (B, L, C) -> c_KV (B, 1, L, d_c), normalised, and the rotated shared key k_R (B, 1, L, d_R) (eq. 9, 15)."""
        latent, k_rope = self.kv_a_proj_with_mqa(x).split((self.kv_lora_rank, self.qk_rope_head_dim), dim=-1)
        latent = self.kv_a_layernorm(latent).unsqueeze(1)  # (B, L, d_c) -> (B, 1, L, d_c): one head for all
        return latent, self.rope(k_rope.unsqueeze(1), positions)  # (B, 1, L, d_R)

    def expand(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """c_KV (B, 1, S, d_c) -> per-head keys k_C (B, H, S, d_N) and values v_C (B, H, S, d_V) (eq. 10, 11)."""
        B, _, S, _ = latent.shape
        kv = self.kv_b_proj(latent.squeeze(1))  # (B, S, H·(d_N + d_V))
        kv = kv.view(B, S, self.num_heads, -1).transpose(1, 2)  # (B, H, S, d_N + d_V)
        return kv.split((self.qk_nope_head_dim, self.v_head_dim), dim=-1)

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """kv_b_proj's weight split per head: W_UK (H, d_N, d_c) and W_UV (H, d_V, d_c)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]  # (H, d_N + d_V, d_c) split

    def attend_naive(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, kv_cache,
                     input_pos: Tensor | None, *, mask, is_causal: bool, return_weights: bool
                     ) -> tuple[Tensor, Tensor | None]:
        """Expand the new tokens' keys and values per head, cache those, attend: out (B, H, L, d_V)."""
        k_nope, v = self.expand(latent)  # (B, H, L, d_N), (B, H, L, d_V)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, L, d_K)
        k = torch.cat((k_nope, k_rope.expand(-1, self.num_heads, -1, -1)), dim=-1)  # (B, H, L, d_K): k_R shared
        if input_pos is not None:
            k, v = kv_cache.write(input_pos, k, v)  # (B, H, M, d_K), (B, H, M, d_V): the whole static cache
        elif kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, H, S, d_K), (B, H, S, d_V)
        return self.attend(q, k, v, mask=mask, is_causal=is_causal, return_weights=return_weights)

    def attend_absorbed(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, cache: LatentCache,
                        input_pos: Tensor | None, *, mask, is_causal: bool, return_weights: bool
                        ) -> tuple[Tensor, Tensor | None]:
        """Cache only [c_KV; k_R]; attend with W_UK in the query and W_UV after the sum: out (B, H, L, d_V)."""
        w_uk, w_uv = self.up_projections()  # (H, d_N, d_c), (H, d_V, d_c)
        q = torch.cat((q_nope @ w_uk, q_rope), dim=-1)  # (B, H, L, d_N) @ (H, d_N, d_c) -> (B, H, L, d_c + d_R)
        kv = cache.update(latent, k_rope) if input_pos is None else cache.write(input_pos, latent, k_rope)
        # kv (B, 1, S, d_c + d_R) holds the keys [c_KV; k_R] of every head; its first d_c dims are the values
        B, H, L, width = q.shape
        S = kv.size(-2)
        self.check_mask(mask, (B, H, L, S))
        # All heads share one key head (multi-query attention, head width d_c + d_R): fold the H·L queries
        # into one head, so one product reads the cache for every head (grouped-query kernels copy it per head).
        # The values are kv whole, its last d_R output dims dropped: fused kernels want values as wide as keys
        # (narrower ones fall back to a path that copies the keys).
        folded = folded_mask(mask, is_causal, H, L, S, q.device)
        out, weights = self.attend(q.reshape(B, 1, H * L, width), kv, kv, mask=folded, is_causal=False,
                                   return_weights=return_weights)  # (B, 1, H·L, d_c + d_R)
        out = out[..., :self.kv_lora_rank].reshape(B, H, L, -1)  # Σ_j w_ij c_KV,j: (B, H, L, d_c)
        out = out @ w_uv.transpose(-2, -1)  # (B, H, L, d_c) @ (H, d_c, d_V) -> (B, H, L, d_V)
        return out, None if weights is None else weights.view(B, H, L, S)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask, is_causal: bool,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """qkv's attention at this module's scale: q (B, h, L, ·) over k, v (B, h, S, ·) -> (out, weights or None)."""
        self.check_mask(mask, (*q.shape[:-1], k.size(-2)))
        dropout_p = self.dropout if self.training else 0.0
        res = attend(q, k, v, mask=mask, is_causal=is_causal, scale=self.softmax_scale, dropout_p=dropout_p,
                     return_weights=return_weights)
        return res if return_weights else (res, None)

    @staticmethod
    def check_mask(mask, scores_shape: tuple[int, ...]) -> None:
        if not isinstance(mask, PreparedMask):  # ours are checked where they are made; the caller's here
            check_mask(mask, None, scores_shape)

    def check_inputs(self, x: Tensor, kv_cache, input_pos: Tensor | None) -> None:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"expected x of shape (B, T, {self.d_model}), got {shape}")
        if input_pos is not None and kv_cache is None:
            raise ValueError("input_pos places tokens in a static KV cache: pass kv_cache too")
        if kv_cache is not None:
            self.check_cache(kv_cache)

    def check_cache(self, kv_cache) -> None:
        """A LatentCache of this layer's (d_c, d_R), or a KVCache of its (H, d_K, d_V)."""
        if isinstance(kv_cache, LatentCache):
            want, got = (self.kv_lora_rank, self.qk_rope_head_dim), (kv_cache.kv_lora_rank, kv_cache.qk_rope_head_dim)
            if got != want:
                raise ValueError(f"LatentCache widths (d_c, d_R) must be {want}, got {got}")
            return
        if not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be a LatentCache or a KVCache (see new_cache), "
                            f"got {type(kv_cache).__name__}")
        want = (self.num_heads, self.qk_head_dim, self.v_head_dim)  # (H, d_K, d_V)
        got = (kv_cache.k.size(1), kv_cache.k.size(-1), kv_cache.v.size(-1))
        if got != want:
            raise ValueError(f"a naive cache must hold (heads, key width, value width) = {want}, got {got}: "
                             "make it with new_cache(mode='naive')")
