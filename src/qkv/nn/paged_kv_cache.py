"""A paged key/value cache (vLLM's PagedAttention layout, Kwon et al. 2023): each layer keeps one pool of
fixed-size blocks, and each sequence a block table of the blocks its tokens sit in.

Shapes: N blocks in a pool, K tokens per block (block size), G key/value heads, D head width, B rows,
n blocks in this step's tables, S = n · K keys per row, T new tokens per row.
A row's token at position p sits in block ``table[b, p // K]`` at offset p mod K. The engine sets the step's
``PageTable`` (tables (B, n), one object shared by every layer) before each forward. ``write(input_pos, k, v)``
scatters the new tokens into their blocks and returns each row's keys gathered in position order, (B, G, S, D):
what a static cache's ``write`` returns with slots = positions, so attention runs unchanged under the caller's
mask (B, S) of the positions written. Without autograd the gathered keys land in the ``PageTable``'s workspace,
one buffer per pool shape that every layer reuses (a layer's keys are read before the next layer writes): valid
until the next paged ``write`` of the same shape. Rows of one token that share a table (a folded prompt's rest) may be
given as ``RowGroups``: a ``PagedKVCache`` then gathers each distinct table's keys once, (u, G, S, D), for a reader
that maps rows to them. Blocks are shared between rows (a common prompt prefix) by putting the
same id in several tables; a row writes only its own blocks.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..checks import check_positive_int
from .latent_attention import LatentCache


class RowGroups(NamedTuple):
    """Rows of one step that continue sequences of the same block table (a folded prompt's rest, one row of one
    token each) read the same keys: gathered once per table. u tables, W the most rows of one table."""

    table: Tensor  # (u, n) the distinct tables
    places: Tensor  # (B,) row b's place in a (u · W) layout: its table's index · W + its rank among that table's rows
    width: int  # W


def row_groups(tables: list[list[int]], device=None) -> RowGroups:
    """The distinct tables of ``tables`` (B rows, each padded to n ids), in first-seen order, and each row's place."""
    index: dict[tuple, int] = {}
    rows: list[list[int]] = []  # per distinct table, its rows
    for b, t in enumerate(tables):
        g = index.setdefault(tuple(t), len(index))
        if g == len(rows):
            rows.append([])
        rows[g].append(b)
    width = max(len(r) for r in rows)
    places = [0] * len(tables)
    for g, members in enumerate(rows):
        for rank, b in enumerate(members):
            places[b] = g * width + rank
    unique = torch.tensor(list(index), device=device)  # (u, n)
    return RowGroups(unique, torch.tensor(places, device=device), width)


class PageTable:
    """The block tables of one step, read by every paged layer: ``table`` (B, n) block ids; a row with fewer
    blocks is padded with any valid id (its positions there are masked)."""

    def __init__(self, block_size: int) -> None:
        check_positive_int("block_size", block_size)
        self.block_size = block_size
        self.table: Tensor | None = None
        self.flat: Tensor | None = None  # the table's ids in row order (B · n,)
        self.workspace: dict[tuple, Tensor] = {}  # (which, shape, dtype, device) -> a buffer gathers reuse
        self.written: tuple | None = None  # (input_pos, its version, slots): see slots
        self.groups: RowGroups | None = None  # rows sharing tables: a PagedKVCache gathers each table once
        self.index: dict[tuple, Tensor] = {}  # this step's scatter and gather indices, per pool kind
        self.in_place = False  # True: a PagedKVCache's write returns its pools, for a reader of blocks in place

    def out(self, which: str, pool: Tensor, rows: int) -> Tensor | None:
        """A buffer (rows, K, W) for this step's gather of ``pool`` (N, C, K, W); ``which`` tells apart pools
        of one shape read in the same layer (keys, values). None under autograd: a fresh tensor each time."""
        if torch.is_grad_enabled():  # attention may keep the keys for its backward
            return None
        key = (which, pool.shape[1:], pool.dtype, pool.device)
        buffer = self.workspace.get(key)
        if buffer is None or buffer.size(0) < rows:
            buffer = self.workspace[key] = pool.new_empty((rows, *pool.shape[2:]))
        return buffer[:rows]

    def heads(self, table: Tensor, C: int) -> Tensor:
        """The rows of a pool (N, C, K, W) viewed as (N · C, K, W) that ``table`` (B, n) reads, head by head:
        table[b, j] · C + c in (b, c, j) order, (B · C · n,); once a step per table and C."""
        key = ("gather", table.data_ptr(), C)
        if key not in self.index:
            self.index[key] = (table[:, None, :] * C + torch.arange(C, device=table.device)[:, None]).flatten()
        return self.index[key]

    def places(self, input_pos: Tensor, C: int) -> Tensor:
        """Where the new tokens at input_pos (B, T) go in a pool (N, C, K, W) viewed as (N · C · K, W): head c of
        the token in slot s (``slots``) at (s // K) · C · K + c · K + s mod K, in (b, t, c) order (B · T · C,)."""
        slots = self.slots(input_pos)
        key = ("scatter", slots.data_ptr(), C)
        if key not in self.index:
            K = self.block_size
            heads = torch.arange(C, device=slots.device) * K
            self.index[key] = ((slots // K * (C * K) + slots % K)[:, None] + heads).flatten()
        return self.index[key]

    def set(self, table: Tensor, groups: RowGroups | None = None) -> None:
        """This step's tables (B, n); ``groups``: its distinct tables, for a reader of keys per table (the paged
        model's ``DecodeAttention``), or None: keys per row."""
        if table.dim() != 2 or table.is_floating_point():
            raise ValueError(f"a block table must be an integer tensor (B, n), got {table.dtype} {tuple(table.shape)}")
        self.table, self.flat, self.written, self.groups = table, table.flatten(), None, groups
        self.index = {}

    def slots(self, input_pos: Tensor) -> Tensor:
        """The slots of the new tokens at input_pos (B, T), their block and offset: table[b, p // K] · K + p mod K,
        (B · T,) (``places`` makes them a pool's rows). Computed once while the same input_pos tensor comes again
        unchanged (every layer writes at the step's one); an inference-mode tensor (no version counter) each time."""
        last = self.written
        if last is not None and last[0] is input_pos and not input_pos.is_inference() and last[1] == input_pos._version:
            return last[2]
        K = self.block_size
        slots = (self.table.gather(1, input_pos // K) * K + input_pos % K).flatten()  # (B · T,)
        self.written = None if input_pos.is_inference() else (input_pos, input_pos._version, slots)
        self.index = {k: v for k, v in self.index.items() if k[0] == "gather"}  # new slots, new places
        return slots

    @property
    def max_len(self) -> int:
        """S = n · K: the positions each row's gathered keys span (what the model's mask (B, S) covers)."""
        return 0 if self.table is None else self.table.size(1) * self.block_size


def scatter_blocks(pool: Tensor, pages: PageTable, input_pos: Tensor, new: Tensor) -> None:
    """new (B, C, T, W) into pool (N, C, K, W) at the rows' positions input_pos (B, T), through pages' table."""
    places = pages.places(input_pos, pool.size(1))
    pool.view(-1, pool.size(-1)).index_copy_(0, places, new.transpose(1, 2).reshape(places.numel(), -1))


def gather_blocks(pool: Tensor, pages: PageTable, which: str, grouped: bool = False) -> Tensor:
    """Each row's blocks of pool (N, C, K, W), in ``pages.table`` (B, n) order -> (B, C, n · K, W), one copy in
    that order (each head's positions of a block lie together), into ``pages.out(which, pool, …)`` when it gives
    a buffer. ``grouped`` with ``pages.groups``: each distinct table's blocks once, in ``pages.groups.table``
    (u, n) order -> (u, C, n · K, W)."""
    table = pages.groups.table if grouped and pages.groups is not None else pages.table
    B, n = table.shape
    _, C, K, W = pool.shape
    index = pages.heads(table, C)
    out = pages.out(which, pool, index.numel())
    flat = pool.view(-1, K, W)  # (N · C, K, W)
    rows = flat.index_select(0, index) if out is None else torch.index_select(flat, 0, index, out=out)
    return rows.view(B, C, n * K, W)


def check_write(input_pos: Tensor, new: Tensor, pages: PageTable) -> None:
    if pages.table is None:
        raise ValueError("a paged cache needs the step's block tables: set its PageTable before the forward")
    if input_pos.dim() != 2 or input_pos.shape != (new.size(0), new.size(2)):
        raise ValueError(f"a paged cache takes per-row positions input_pos (B={new.size(0)}, T={new.size(2)}), "
                         f"got {tuple(input_pos.shape)}")
    if pages.table.size(0) != new.size(0):
        raise ValueError(f"block tables for B={new.size(0)} rows expected, got {pages.table.size(0)}")


class PagedKVCache(nn.Module):
    """Keys and values of one layer in blocks, (N, G, K, D) each; the block tables come from ``pages``.

    The pools are ``torch.empty``: a block's memory is first touched when a token is written to it.
    """

    def __init__(self, num_blocks: int, num_kv_heads: int, head_dim: int, *, pages: PageTable, dtype=None,
                 device=None) -> None:
        super().__init__()
        for name, value in (("num_blocks", num_blocks), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        shape = (num_blocks, num_kv_heads, pages.block_size, head_dim)
        self.register_buffer("k", torch.empty(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.empty(shape, dtype=dtype, device=device), persistent=False)
        self.pages = pages
        self.pos = 0  # never grows: a paged cache is written at explicit positions only

    @property
    def max_len(self) -> int:
        return self.pages.max_len

    def write(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, G, T, D) at each row's positions input_pos (B, T); return every row's keys and values
        over its table's blocks, (B, G, S, D) each, in position order; with ``pages.groups``, each distinct
        table's, (u, G, S, D) (its reader maps rows to them); with ``pages.in_place``, the pools themselves."""
        check_write(input_pos, k, self.pages)
        scatter_blocks(self.k, self.pages, input_pos, k.to(self.k.dtype))
        scatter_blocks(self.v, self.pages, input_pos, v.to(self.v.dtype))
        if self.pages.in_place:  # the reader takes the pools (N, G, K, D) and the table as they are
            return self.k, self.v
        return gather_blocks(self.k, self.pages, "k", True), gather_blocks(self.v, self.pages, "v", True)


class PagedLatentCache(LatentCache):
    """MLA's absorbed cache ([c_KV; k_R] per token, ``LatentCache``) in blocks, (N, 1, K, d_c + d_R)."""

    def __init__(self, num_blocks: int, kv_lora_rank: int, qk_rope_head_dim: int, *, pages: PageTable,
                 dtype=None, device=None) -> None:
        nn.Module.__init__(self)
        for name, value in (("num_blocks", num_blocks), ("kv_lora_rank", kv_lora_rank),
                            ("qk_rope_head_dim", qk_rope_head_dim)):
            check_positive_int(name, value)
        shape = (num_blocks, 1, pages.block_size, kv_lora_rank + qk_rope_head_dim)
        self.register_buffer("kv", torch.empty(shape, dtype=dtype, device=device), persistent=False)
        self.kv_lora_rank, self.qk_rope_head_dim, self.pages, self.pos = kv_lora_rank, qk_rope_head_dim, pages, 0

    @property
    def max_len(self) -> int:
        return self.pages.max_len

    def write(self, input_pos: Tensor, latent: Tensor, k_rope: Tensor) -> Tensor:
        """Write latent (B, 1, T, d_c) and k_rope (B, 1, T, d_R) at input_pos (B, T); return (B, 1, S, d_c + d_R)."""
        if latent.size(-1) != self.kv_lora_rank or k_rope.size(-1) != self.qk_rope_head_dim:
            raise ValueError(f"expected latent (…, {self.kv_lora_rank}) and k_rope (…, {self.qk_rope_head_dim}), "
                             f"got {tuple(latent.shape)} and {tuple(k_rope.shape)}")
        new = torch.cat((latent, k_rope), dim=-1).to(self.kv.dtype)  # (B, 1, T, d_c + d_R)
        check_write(input_pos, new, self.pages)
        scatter_blocks(self.kv, self.pages, input_pos, new)
        return gather_blocks(self.kv, self.pages, "kv")

    def update(self, latent: Tensor, k_rope: Tensor) -> Tensor:
        raise ValueError("a paged cache is written at explicit positions: pass input_pos")
