"""A model over a paged KV cache: the per-layer block pools, their size from a memory budget, and the forward of
rows that each continue their own sequence (``qkv.nn.paged_kv_cache`` holds the layout).

Shapes: B rows, T new tokens per row, n blocks in the longest row's table, K block size, S = n · K, V vocabulary.
A layer whose model keeps a ``KVCache`` gets a ``PagedKVCache``, MLA's ``LatentCache`` a ``PagedLatentCache``.
A sliding-window layer (a ``RingKVCache`` in a static cache) keeps all its tokens in blocks too, the window
applied by the model's mask: the same answers, without the ring's saving of memory.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from ..kernels import build as kernels
from ..nn.kv_cache import KVCache, RingKVCache
from ..nn.latent_attention import LatentCache
from ..nn.paged_kv_cache import PageTable, PagedKVCache, PagedLatentCache, row_groups
from .blocks import BlockManager
from .paged_attention import DecodeAttention, decode_attention

BLOCK_SIZE = 16  # tokens per block (vLLM's default)
MEMORY_SHARE = {"cpu": 0.5, "cuda": 0.9}  # the default budget: this share of the device's free memory


def refuses(model) -> str | None:
    """Why a paged cache cannot hold ``model``'s keys, or None: each layer must keep a KVCache, RingKVCache
    or LatentCache (MLA's naive cache and others are not paged), and positions must not be a bias over
    shared key places (ALiBi, T5)."""
    kinds = {type(c).__name__ for c in model.new_kv_caches(1, 1)} - {"KVCache", "RingKVCache", "LatentCache"}
    if kinds:
        return (f"the paged cache holds a KVCache, RingKVCache or LatentCache per layer; this model keeps "
                f"{', '.join(sorted(kinds))} (attention.kind {model.config.attention.kind})")
    if model.config.position.kind in ("alibi", "t5"):
        return f"position.kind {model.config.position.kind} is a bias over shared key places"
    return None


def token_bytes(model, dtype: torch.dtype | None = None) -> int:
    """Bytes one token's keys and values take in every layer of ``model``'s cache."""
    dtype = dtype or model.lm_head.weight.dtype
    numbers = 0
    for cache in model.new_kv_caches(1, 1, dtype=dtype, device="meta"):
        numbers += cache.kv[0, :, 0].numel() if isinstance(cache, LatentCache) else 2 * cache.k[0, :, 0].numel()
    return numbers * torch.empty((), dtype=dtype).element_size()


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now: a GPU's free memory, or a CPU's available memory (Linux's MemAvailable)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_blocks(model, *, max_batch: int, max_model_len: int, memory: int | None = None,
                block_size: int = BLOCK_SIZE, dtype: torch.dtype | None = None) -> tuple[int, str]:
    """(the number of blocks, why): ``memory`` bytes of keys and values, or by default a share of the free
    memory, and never more than ``max_batch`` sequences of ``max_model_len`` tokens need. ValueError when the
    blocks cannot hold one sequence of ``max_model_len`` tokens."""
    per_block = token_bytes(model, dtype) * block_size
    need = max_batch * -(-max_model_len // block_size)  # blocks for every row at its longest
    device = model.lm_head.weight.device
    if memory is None:
        share = MEMORY_SHARE.get(device.type, 0.5)
        budget, why = int(share * free_memory(device)), f"{share:.0%} of the free memory"
    else:
        budget, why = memory, "--kv-cache-memory"
    blocks = min(budget // per_block, need)
    if blocks < -(-max_model_len // block_size):
        raise ValueError(f"a KV-cache budget of {budget / 2**20:.0f} MiB ({why}) holds {blocks} blocks of "
                         f"{block_size} tokens, fewer than one sequence of max_model_len={max_model_len} needs: "
                         f"raise the budget or lower max_model_len")
    capped = " (capped at max_batch × max_model_len)" if blocks == need else ""
    return blocks, (f"{blocks} blocks of {block_size} tokens, {blocks * per_block / 2**20:.0f} MiB: {why}{capped}; "
                    "memory is touched as blocks fill")


@contextmanager
def head_rows(head: nn.Module, rows: Tensor | None) -> Iterator[None]:
    """Inside: ``head`` (the model's LM head) reads only ``rows`` (k,) of its input's first axis (a forward
    pre-hook; removed after, also on an error); None: all."""
    if rows is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda module, args: (args[0].index_select(0, rows), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


class PagedModel:
    """``model`` decoding many sequences over one paged cache of ``num_blocks`` blocks: ``blocks`` says which
    block holds what, ``forward`` runs rows over their block tables."""

    def __init__(self, model, num_blocks: int, *, block_size: int = BLOCK_SIZE, dtype=None) -> None:
        reason = refuses(model)
        if reason is not None:
            raise ValueError(reason)
        self.model, self.pages = model, PageTable(block_size)
        self.device = model.lm_head.weight.device
        kw = dict(pages=self.pages, dtype=dtype or model.lm_head.weight.dtype, device=self.device)
        self.caches = []
        for cache in model.new_kv_caches(1, 1, device="meta"):
            if isinstance(cache, LatentCache):
                self.caches.append(PagedLatentCache(num_blocks, cache.kv_lora_rank, cache.qk_rope_head_dim, **kw))
            elif isinstance(cache, (KVCache, RingKVCache)):
                self.caches.append(PagedKVCache(num_blocks, cache.k.size(1), cache.k.size(3), **kw))
        self.blocks = BlockManager(num_blocks, block_size)
        self.swapped = False  # inside ``decoding``
        self.shares = False  # inside ``decoding``: rows of one table may read its keys once (``RowGroups``)
        self.cleared: set[int] = set()  # blocks zeroed once: a masked key's value must be finite (0 · NaN is NaN)

    def forward(self, ids: Tensor, starts: list[int], tables: list[list[int]], rows: list[int] | None = None) -> Tensor:
        """Rows b of ids (B, T) continue their sequences at positions starts[b] …, over the blocks tables[b]
        (every one of those positions included) -> the logits after each row's last token (B, V), or after only
        the ``rows`` listed (k, V) (the head computes no others: a folded prompt's rows but its last need none)."""
        B, T = ids.shape
        self.clear({b for t in tables for b in t} - self.cleared)
        start = torch.tensor(starts, device=self.device)[:, None]  # (B, 1)
        input_pos = start + torch.arange(T, device=self.device)  # (B, T)
        keep = None if rows is None or len(rows) == B else torch.tensor(rows, device=self.device)
        with self.decoding(), head_rows(self.model.lm_head, keep):  # one query a row: grouped products
            self.set_tables(tables, T)
            written = torch.arange(self.pages.max_len, device=self.device) < start + T  # (B, S)
            out = self.model(ids, mask=written, kv_caches=self.caches, input_pos=input_pos, logits_to_keep=1)
        return out.logits[:, -1]

    def set_tables(self, tables: list[list[int]], T: int) -> None:
        """The step's tables (B, n), each padded with its first id, into ``pages``; rows of one token that share a
        table (a folded prompt's rest) as ``RowGroups`` where ``shares``."""
        n = max(len(t) for t in tables)
        padded = [t + [t[0]] * (n - len(t)) for t in tables]
        shared = T == 1 and self.shares and not self.pages.in_place and len(set(map(tuple, padded))) < len(padded)
        self.pages.set(torch.tensor(padded, device=self.device), row_groups(padded, self.device) if shared else None)

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Inside: the model's attention and rotary modules are the paged steps' (``decode_attention``), swapped
        once for every forward inside (a server's run) rather than at each."""
        if self.swapped:
            yield
            return
        with decode_attention(self.model):
            readers = [m for m in self.model.modules() if type(m) is DecodeAttention]
            for m in readers:
                m.pages = self.pages
            # rows of one table read its keys once only where every paged layer's reader is a DecodeAttention
            self.swapped = True
            self.shares = len(readers) == sum(isinstance(c, PagedKVCache) for c in self.caches)
            # and read them in place, through qkv's kernel, where it is built for this device
            self.pages.in_place = self.shares and self.device.type == "cpu" and kernels.available()
            try:
                yield
            finally:
                self.swapped = self.shares = self.pages.in_place = False
                for m in readers:
                    del m.pages

    def clear(self, blocks: set[int]) -> None:
        """Zero ``blocks`` in every layer, on their first use (the pools start as ``torch.empty``)."""
        if blocks:
            index = torch.tensor(sorted(blocks), device=self.device)
            for cache in self.caches:
                for pool in cache.buffers():
                    pool.index_fill_(0, index, 0)
            self.cleared |= blocks
