"""The paged cache's block manager: which blocks are free, how many sequences hold each, and which full blocks
hold which tokens, so that sequences with a common prefix share its blocks (prefix caching, as vLLM's and
SGLang's).

A full block is known by a chained hash: that of its tokens and of the blocks before it, so one key names a
whole prefix. A block whose last holder lets go keeps its tokens and its key among the *cached* free blocks
until it is needed for something else (least recently freed first): a later prompt with that prefix takes it
back instead of recomputing it.
"""
from __future__ import annotations

from collections import OrderedDict

from ..checks import check_positive_int


class NoBlocks(Exception):
    """Every block is held: the caller preempts a sequence or waits."""


def block_keys(ids: list[int], block_size: int, keys: list[int] | None = None) -> list[int]:
    """The chained keys of the full blocks of ``ids``; ``keys``: those of its first blocks, known already."""
    keys = list(keys or [])
    for i in range(len(keys), len(ids) // block_size):
        parent = keys[-1] if keys else None
        keys.append(hash((parent, tuple(ids[i * block_size:(i + 1) * block_size]))))
    return keys


class BlockManager:
    """Blocks 0 … N − 1 of a paged cache: ``allocate`` and ``release`` by reference count, ``match`` and
    ``register`` for prefix caching."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        check_positive_int("num_blocks", num_blocks)
        check_positive_int("block_size", block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free = list(reversed(range(num_blocks)))  # a stack: the block freed last, its memory touched, comes first
        self.cached: OrderedDict[int, None] = OrderedDict()  # free blocks that keep a prefix, least recent first
        self.refs = [0] * num_blocks
        self.block_of: dict[int, int] = {}  # key -> the block holding that prefix's last block
        self.key_of: dict[int, int] = {}  # block -> its key

    @property
    def available(self) -> int:
        """Blocks ``allocate`` can hand out now (free, or cached and evictable)."""
        return len(self.free) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self.available

    def allocate(self) -> int:
        """A block for one sequence (reference count 1); the least recently freed cached block when none is
        free; NoBlocks when every block is held."""
        if self.free:
            block = self.free.pop()
        elif self.cached:
            block, _ = self.cached.popitem(last=False)
            del self.block_of[self.key_of.pop(block)]
        else:
            raise NoBlocks(f"all {self.num_blocks} blocks are in use")
        self.refs[block] = 1
        return block

    def release(self, blocks: list[int]) -> None:
        """One holder lets go of ``blocks``; each one nobody holds becomes free, or cached if it has a key
        (the last blocks first, so a prefix's head stays cached longest)."""
        for block in reversed(blocks):
            if self.refs[block] <= 0:
                raise ValueError(f"block {block} is released but nobody holds it")
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.key_of:
                    self.cached[block] = None
                else:
                    self.free.append(block)

    def match(self, keys: list[int]) -> list[int]:
        """The blocks holding the longest cached run of ``keys`` (a prefix's full blocks), each now also held
        by the caller."""
        blocks = []
        for key in keys:
            block = self.block_of.get(key)
            if block is None:
                break
            if self.refs[block] == 0:
                del self.cached[block]
            self.refs[block] += 1
            blocks.append(block)
        return blocks

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """Full blocks ``blocks[i]`` hold the prefix of ``keys[i]``: later prompts may share them (a key already
        held by another block keeps that one)."""
        for block, key in zip(blocks, keys):
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key], self.key_of[block] = block, key
