"""The paged model's decode attention: one query per row and head, over grouped key/value heads, in two batched
products (vLLM's paged decode kernel does the same work per block).

    scores = q_g Kᵀ_g · scale + bias     q_g (B, G, H/G, D): the H / G query heads that share key head g
    out    = softmax(scores) V_g          (B, G, H/G, D) -> (B, H, 1, D)

``F.scaled_dot_product_attention`` computes one query per head at a time on a CPU (its flash kernel, slower
still in bf16); grouping the query heads that read one key head makes each head group one small matrix product.
The answer is the reference's (``qkv.nn.attention.reference_attention``: the softmax in fp32) to rounding. Keys and
values are taken contiguous (B, G, S, D) (the paged cache gathers them so; a strided view is copied once), so
that each product is one batched call over (B, G) (in bf16, oneDNN's batched product is then several times
faster than one call per key head on a strided view).

``DecodeAttention`` is ``MultiHeadAttention`` with this core for one query under a prepared mask (the paged
model's steps); ``StepRotary`` is ``RotaryEmbedding`` whose cos and sin, the same for every layer of a step, are
computed by the first layer and reused by the others (the same values: the answer is unchanged).
``decode_attention(model)`` swaps its plain attention and rotary modules' classes for the block's duration, as the
speed layer swaps linears (``qkv.kernels.transform``): a server enters it once for its run.
Shapes: B rows, H query heads, G key/value heads, D head width, S keys.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from ..nn.masks import PreparedMask
from ..nn.paged_kv_cache import RowGroups, gather_blocks
from ..nn.positional import RotaryEmbedding


def grouped_one_query(q: Tensor, k: Tensor, v: Tensor, mask: PreparedMask, scale: float) -> Tensor:
    """q (B, H, 1, D) over k, v (B, G, S, D) under ``mask`` (its bias broadcastable to (B, H, 1, S)) ->
    (B, H, 1, D); a row with no allowed key gets zeros (``mask.live``)."""
    B, H, _, D = q.shape
    G, S = k.size(1), k.size(2)
    bias = mask.bias if mask.bias.dtype == q.dtype else mask.bias.to(q.dtype)
    bias = bias.reshape(bias.size(0), G, H // G, S) if bias.size(1) == H else bias.reshape(bias.size(0), 1, 1, S)
    q = q.reshape(B, G, H // G, D)  # the H / G query heads of each key head
    k, v = k.contiguous(), v.contiguous()  # (B, G, S, D): one batched product over (B, G), not one per key head
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)  # (B, G, H/G, S)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v)  # (B, G, H/G, D)
    out = out.view(B, H, 1, D)
    return out if mask.live is None else out * mask.live


def shared_keys_query(q: Tensor, k: Tensor, v: Tensor, mask: PreparedMask, scale: float, groups: RowGroups) -> Tensor:
    """q (B, H, 1, D), each row over the keys of its table, k, v (u, G, S, D) (``groups``: row b's table is
    places[b] // W), under ``mask`` (its bias (B, 1, 1, S)) -> (B, H, 1, D): ``grouped_one_query`` with the
    rows of one table as W queries of one product (a padded query reads no key of its own: zeros, bias 0)."""
    B, H, _, D = q.shape
    u, G, S = k.shape[:3]
    h, W = H // G, groups.width
    bias = mask.bias if mask.bias.dtype == q.dtype else mask.bias.to(q.dtype)
    padded = q.new_zeros(u * W, H, D).index_copy_(0, groups.places, q.view(B, H, D))
    qg = padded.view(u, W, G, h, D).transpose(1, 2).reshape(u, G, W * h, D)  # a table's rows, head group by group
    bias = bias.new_zeros(u * W, S).index_copy_(0, groups.places, bias.view(B, S)).view(u, 1, W, 1, S)
    k, v = k.contiguous(), v.contiguous()
    scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale)  # (u, G, W·h, S)
    scores.view(u, G, W, h, S).add_(bias)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v).view(u, G, W, h, D).transpose(1, 2).reshape(u * W, H, D)
    out = out.index_select(0, groups.places).view(B, H, 1, D)
    return out if mask.live is None else out * mask.live


def paged_one_query(q: Tensor, k: Tensor, v: Tensor, table: Tensor, mask: PreparedMask, scale: float) -> Tensor:
    """q (B, H, 1, D) over each row's blocks of the pools k, v (N, G, K, D) through ``table`` (B, n), read where
    they lie (``torch.ops.qkv.paged_decode_attention``: fp32 sums) under ``mask`` (its bias (B, 1, 1, n · K)) ->
    (B, H, 1, D): ``grouped_one_query``'s answer over the gathered keys, to rounding."""
    B, H, _, D = q.shape
    bias = mask.bias.reshape(B, -1).float().contiguous()  # (B, S)
    out = torch.ops.qkv.paged_decode_attention(q.reshape(B, H, D).float().contiguous(), k, v, table, bias, scale)
    out = out.to(q.dtype).view(B, H, 1, D)
    return out if mask.live is None else out * mask.live


class DecodeAttention(MultiHeadAttention):
    """``MultiHeadAttention`` whose core, for one query under a prepared mask (B or 1, H or 1, 1, S) (no score
    bias, soft cap, dropout or weights asked), is ``grouped_one_query``; anything else is the reference's.
    ``pages`` (a ``PageTable``, set by the paged model) with ``groups``: the keys come once per distinct table
    (u, G, S, D), read by ``shared_keys_query`` (or taken per row for the reference's core); with ``in_place``, the
    pools themselves, read in place by ``paged_one_query`` (or gathered here for the reference's core)."""

    pages = None

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor, *, mask, is_causal: bool, positions: Tensor | None,
                     return_weights: bool) -> tuple[Tensor, Tensor | None]:
        plain = (self.alibi is None and self.relative_bias is None and self.softcap is None
                 and not (self.training and self.dropout > 0))
        one_query = q.size(-2) == 1 and isinstance(mask, PreparedMask) and mask.bias.dim() == 4
        fast = one_query and not (is_causal or return_weights) and plain
        scale = 1.0 / math.sqrt(q.size(-1)) if self.scale is None else self.scale
        pages = self.pages
        if pages is not None and pages.in_place:  # k, v are the pools (N, G, K, D)
            if fast and mask.bias.shape[:3] == (q.size(0), 1, 1):
                return paged_one_query(q, k, v, pages.table, mask, scale), None
            k, v = gather_blocks(k, pages, "k"), gather_blocks(v, pages, "v")
        groups = None if pages is None else pages.groups
        if groups is not None and k.size(0) == groups.table.size(0) != q.size(0):
            if fast and mask.bias.shape[:3] == (q.size(0), 1, 1):
                return shared_keys_query(q, k, v, mask, scale, groups), None
            rows = groups.places // groups.width  # each row's table
            k, v = k.index_select(0, rows), v.index_select(0, rows)
        if fast:
            return grouped_one_query(q, k, v, mask, scale), None
        return super().attend_heads(q, k, v, mask=mask, is_causal=is_causal, positions=positions,
                                    return_weights=return_weights)


class StepRotary(RotaryEmbedding):
    """``RotaryEmbedding`` whose ``angles`` come from ``shared`` (one dict for the rotary modules of equal
    frequencies) when the last call there had the same positions: the same tensor, unchanged (its version), so
    the same values; its tensor is held, so its memory cannot be another's meanwhile. A whole-width, half-split
    rotation is x·[cos, cos] + [x₂, x₁]·[−sin, sin] over tables made once a step: the reference's products and
    sums, each the same rounding (x₂·(−sin) is −(x₂·sin), a + (−b) is a − b), in fewer operations."""

    shared: dict

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.tables(positions)[0]

    def tables(self, positions: Tensor) -> list:
        """[(cos, sin), the whole-width (cos, ±sin) or None until asked] for ``positions``, shared while unchanged."""
        if positions.is_inference():  # no version counter: computed each time
            return [super().angles(positions), None]
        key = (positions.data_ptr(), positions.shape, positions.stride(), positions._version, positions.dtype,
               self.inv_freq._version)
        last = self.shared.get("last")
        if last is None or last[0] != key:
            last = self.shared["last"] = (key, positions, [super().angles(positions), None])
        return last[2]

    def forward(self, x: Tensor, positions: Tensor | int | None = None) -> Tensor:
        whole = isinstance(x, Tensor) and x.dim() == 4 and x.size(-1) == self.head_dim == self.rotary_dim
        if self.interleaved or not whole:
            return super().forward(x, positions)
        tables = self.tables(self._row_positions(positions, x))
        if tables[1] is None:
            cos, sin = tables[0]  # (…, T, D/2)
            tables[1] = (torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))  # (…, T, D)
        cos, sin = tables[1]
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos).add_(torch.cat((x2, x1), dim=-1).mul_(sin)).to(x.dtype)


def rotary_groups(model: nn.Module) -> dict[tuple, list[RotaryEmbedding]]:
    """``model``'s modules of exactly the class ``RotaryEmbedding`` whose table does not follow the length, grouped
    by what their angles depend on (frequencies, attention factor, device)."""
    groups: dict[tuple, list[RotaryEmbedding]] = {}
    for m in model.modules():
        if type(m) is RotaryEmbedding and not m.follows_length:
            key = (tuple(m.inv_freq.tolist()), m.attention_factor, m.inv_freq.device)
            groups.setdefault(key, []).append(m)
    return groups


@contextmanager
def decode_attention(model: nn.Module) -> Iterator[nn.Module]:
    """``model``'s modules of exactly the class ``MultiHeadAttention`` compute their core as ``DecodeAttention``
    inside the block, and those of exactly ``RotaryEmbedding`` (a fixed table) are ``StepRotary``, one shared dict
    for equal frequencies (parameters, buffers and hooks untouched); the classes restored after (also on an
    error)."""
    swapped = [m for m in model.modules() if type(m) is MultiHeadAttention]
    groups = rotary_groups(model)
    rotary = [m for group in groups.values() for m in group]
    for m in swapped:
        m.__class__ = DecodeAttention
    for group in groups.values():
        shared: dict = {}
        for m in group:
            m.__class__, m.shared = StepRotary, shared
    try:
        yield model
    finally:
        for m in swapped:
            m.__class__ = MultiHeadAttention
        for m in rotary:
            m.__class__ = RotaryEmbedding
            del m.shared
