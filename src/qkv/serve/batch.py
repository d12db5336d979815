"""The running batch: the admitted requests over the paged model, their blocks, and the step that moves them on.

Requests are admitted from the waiting queue while a row is free and the blocks their prompt needs remain, besides
one for each decoding row (blocks already holding the prompt's prefix are shared, not recomputed); prompts are
prefilled in chunks of at most ``max_prefill_tokens`` tokens a step; every decoding row takes one token in one
batched forward, and a row that needs a new block when none is left preempts the newest request, which waits again
first, to be recomputed.

Shapes: n rows decoding, V vocabulary; a request's context = its prompt + its tokens so far, of which
``computed`` have their keys and values in its blocks.
"""
from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from ..generation import next_token
from ..generation.blocks import NoBlocks, block_keys
from ..generation.paged import PagedModel
from .request import Request
from .waiting import WaitingQueue

FOLD_TOKENS = 32  # a prompt's rest this short is computed in the decode step's forward, as rows of one token


class Batch:
    """At most ``max_batch`` requests prefilling or decoding over ``paged`` (its block manager: ``blocks``);
    ``waiting`` is where they come from and where a preempted one goes back; ``stats`` counts what happened."""

    def __init__(self, paged: PagedModel, waiting: WaitingQueue, *, max_batch: int, max_len: int,
                 max_prefill_tokens: int) -> None:
        self.paged, self.waiting, self.blocks = paged, waiting, paged.blocks
        self.block_size = self.blocks.block_size
        self.max_batch, self.max_len, self.max_prefill_tokens = max_batch, max_len, max_prefill_tokens
        self.running: list[Request] = []  # decoding, oldest first
        self.prefilling: deque[Request] = deque()  # admitted, their prompts being prefilled
        self.stats = {"preempted": 0, "shared_blocks": 0, "prefill_chunks": 0, "folded": 0, "max_blocks_used": 0}

    def __len__(self) -> int:
        """Requests admitted now (prefilling or decoding)."""
        return len(self.running) + len(self.prefilling)

    def admit(self) -> None:
        """Waiting requests into rows while rows and blocks remain, sharing the cached blocks of their prefix."""
        while len(self) < self.max_batch:
            request = self.waiting.first()
            if request is None:
                return
            context = request.context
            request.keys = block_keys(context[:len(context) - 1], self.block_size)  # the last token is recomputed
            shared = self.blocks.match(request.keys)
            need = -(-len(context) // self.block_size) - len(shared)
            if need + len(self.running) > self.blocks.available:  # a block kept for each decoding row's next one
                self.blocks.release(shared)
                return
            request.blocks = shared + [self.blocks.allocate() for _ in range(need)]
            request.computed = len(shared) * self.block_size
            self.stats["shared_blocks"] += len(shared)
            if request.settings.seed is not None and request.generator is None:
                request.generator = torch.Generator(device=self.paged.device).manual_seed(request.settings.seed)
            self.waiting.pop()
            self.prefilling.append(request)

    def prefill(self) -> None:
        """Prompts' next chunks, oldest first, ``max_prefill_tokens`` tokens in all; a finished prompt's first
        token is taken and it starts decoding. A prompt whose rest fits in the budget and in ``FOLD_TOKENS``
        (a shared system prompt's tail) joins the decoding rows instead: ``decode`` computes it in their forward."""
        budget = self.max_prefill_tokens
        while self.prefilling and budget > 0:
            request = self.prefilling[0]
            self.catch_up(request)
            context = request.context
            if len(context) - request.computed <= min(budget, FOLD_TOKENS):
                budget -= len(context) - request.computed
                self.stats["prefill_chunks"] += 1
                self.stats["folded"] += 1
                self.running.append(self.prefilling.popleft())
                continue
            end = min(len(context), request.computed + budget)
            ids = torch.tensor([context[request.computed:end]], device=self.paged.device)  # (1, chunk)
            logits = self.paged.forward(ids, [request.computed], [request.blocks[:-(-end // self.block_size)]])
            budget -= end - request.computed
            request.computed = end
            self.stats["prefill_chunks"] += 1
            self.register(request)
            if end == len(context):
                self.prefilling.popleft()
                self.running.append(request)
                self.advance([request], logits)

    def catch_up(self, request: Request) -> None:
        """The full blocks of ``request``'s prompt that another request has computed since its admission (the same
        prefix, admitted in the same step and prefilled first) replace its own blocks there, not yet computed."""
        done, offset = divmod(request.computed, self.block_size)
        shared = [] if offset else self.blocks.match(request.keys[done:])
        if shared:
            own = request.blocks[done:done + len(shared)]
            request.blocks[done:done + len(shared)] = shared
            self.blocks.release(own)
            request.computed += len(shared) * self.block_size
            self.stats["shared_blocks"] += len(shared)

    def decode(self) -> None:
        """One token for every decoding row, each at its own position, in one forward; a folded prompt's rest
        rides along as one row per token (every row's keys are written before any row reads them, and each
        row's mask stops at its position: causal attention)."""
        for request in list(self.running):
            if request in self.running:
                self.make_room(request)
        if not self.running:
            return
        requests, ids, starts, tables, last = list(self.running), [], [], [], []
        for request in requests:
            context = request.context
            for position in range(request.computed, len(context)):  # one position, but a folded prompt's rest
                ids.append([context[position]])
                starts.append(position)
                tables.append(request.blocks)
            last.append(len(ids) - 1)
            request.computed = len(context)
        logits = self.paged.forward(torch.tensor(ids, device=self.paged.device), starts, tables, last)  # (n, V)
        for request in requests:
            self.register(request)
        self.advance(requests, logits)

    def make_room(self, request: Request) -> None:
        """A block for ``request``'s next token if it needs one: preempting the newest requests until one is free
        (``request`` itself, when it is the newest)."""
        if request.computed < len(request.blocks) * self.block_size:
            return
        while True:
            try:
                request.blocks.append(self.blocks.allocate())
                return
            except NoBlocks:
                victim = self.prefilling[-1] if self.prefilling else self.running[-1]
                self.preempt(victim)
                if victim is request:
                    return

    def preempt(self, request: Request) -> None:
        """Free ``request``'s blocks and queue it first again, to be recomputed from its prompt and tokens."""
        self.leave(request)
        request.computed, request.keys = 0, []
        self.stats["preempted"] += 1
        self.waiting.put_first(request)

    def register(self, request: Request) -> None:
        """``request``'s computed full blocks become shareable (their chained keys extended over its new tokens;
        a prompt's keys are known from admission, its blocks still to be prefilled are not shared)."""
        request.keys = block_keys(request.context[:request.computed], self.block_size, request.keys)
        self.blocks.register(request.blocks, request.keys[:request.computed // self.block_size])

    def advance(self, rows: list[Request], logits: Tensor) -> None:
        """The rows take their tokens from logits (k, V); the finished ones leave."""
        tokens = next_tokens(rows, logits).tolist()  # (k,)
        for request, token in zip(rows, tokens):
            if request.take(token, self.max_len - len(request.context)):
                self.leave(request)

    def leave(self, request: Request) -> None:
        """``request`` leaves its row; its blocks are released."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.prefilling:
            self.prefilling.remove(request)
        self.blocks.release(request.blocks)
        request.blocks = []

    def holds(self, request: Request) -> bool:
        """Whether ``request`` is admitted (prefilling or decoding)."""
        return request in self.running or request in self.prefilling


def next_tokens(rows: list[Request], logits: Tensor) -> Tensor:
    """Each row's next token from logits (k, V): greedy rows by argmax at once, sampled ones each with its own
    temperature, top_p and generator -> (k,)."""
    tokens = logits.float().argmax(-1)  # (k,); fp32: argmax over bf16 is many times slower, its answer the same
    for i, request in enumerate(rows):
        s = request.settings
        if s.temperature > 0:
            top_p = s.top_p if s.top_p is not None and s.top_p < 1 else None
            tokens[i] = next_token(logits[i:i + 1], temperature=s.temperature, top_p=top_p,
                                   generator=request.generator)[0]
    return tokens
