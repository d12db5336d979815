"""The server's scheduler: one thread owns the model and a paged KV cache; at each step it decides who runs.

Each step (vLLM's scheduler, nano-vllm's in few lines):
1. waiting requests are admitted, oldest first, while a row is free and the blocks their prompt needs remain,
   besides one for each decoding row (blocks already holding the prompt's prefix, a chat template's system
   prompt, are shared, not recomputed);
2. admitted prompts are prefilled in chunks of at most ``max_prefill_tokens`` tokens a step, so that a long
   prompt does not stall the rows decoding;
3. every decoding row takes one token, in one batched forward; a row that needs a new block when none is left
   preempts the newest request, whose blocks are freed and which is queued again first with its prompt and
   its tokens so far, to be recomputed (its full blocks stay cached, so mostly taken back).
A request finishes at an end id, a stop string, max_tokens or max_model_len, and frees its blocks.

Shapes: n rows decoding, V vocabulary; a request's context = its prompt + its tokens so far, of which
``computed`` have their keys and values in its blocks.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable

import torch
from torch import Tensor

from ..generation import next_token
from ..generation.blocks import NoBlocks, block_keys
from ..generation.paged import BLOCK_SIZE, PagedModel, paged_refuses
from ..generation.plan import plan_serving
from .request import QueueFull, Request, Settings

__all__ = ["QueueFull", "Request", "Scheduler", "Settings", "check_servable"]


def check_servable(model) -> None:
    """ValueError unless ``model`` is a decoder whose keys a paged cache holds (``paged_refuses``)."""
    from ..models import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"serving needs a decoder (qkv.GPT), got {type(model).__name__}")
    reason = paged_refuses(model)
    if reason is not None:
        raise ValueError(f"{reason}: not served")


class Scheduler:
    """The scheduler and its thread: ``submit`` a Request, tokens come through its ``on_event``.

    At most ``max_batch`` requests run (prefill or decode) together; ``max_queue`` more wait; past that ``submit``
    raises QueueFull. ``kv_cache_memory``: bytes for keys and values (None: a share of the free memory, capped at
    what max_batch rows of max_model_len tokens need). ``backend``: "auto" (the linears through qkv's CPU
    kernels, as ``generate``) or "eager".
    """

    def __init__(self, model, *, max_batch: int = 32, max_queue: int = 64, backend: str = "auto",
                 max_model_len: int | None = None, kv_cache_memory: int | None = None, block_size: int = BLOCK_SIZE,
                 max_prefill_tokens: int = 512) -> None:
        check_servable(model)
        max_model_len = max_model_len or model.config.max_len
        if max_batch < 1 or max_queue < 0 or max_prefill_tokens < 1 or not 2 <= max_model_len <= model.config.max_len:
            raise ValueError(f"need max_batch >= 1, max_queue >= 0, max_prefill_tokens >= 1, 2 <= max_model_len <= "
                             f"the model's max_len {model.config.max_len}, got {max_batch}, {max_queue}, "
                             f"{max_prefill_tokens}, {max_model_len}")
        self.plan = plan_serving(model, backend=backend, max_batch=max_batch, max_model_len=max_model_len,
                                 memory=kv_cache_memory, block_size=block_size)  # str(plan): what and why
        self.model = model.eval()
        self.max_batch, self.max_queue, self.max_len = max_batch, max_queue, max_model_len
        self.max_prefill_tokens = max_prefill_tokens
        self.paged = PagedModel(model, self.plan.num_blocks, block_size=block_size, dtype=self.plan.dtype)
        self.blocks, self.block_size = self.paged.blocks, block_size
        self.running: list[Request] = []  # decoding, oldest first
        self.prefilling: deque[Request] = deque()  # admitted, their prompts being prefilled
        self.waiting: deque[Request] = deque()
        self.stats = {"preempted": 0, "shared_blocks": 0, "prefill_chunks": 0, "max_blocks_used": 0}
        self.lock = threading.Condition()
        self.closing, self.thread = False, None

    @property
    def active(self) -> int:
        """Requests admitted now (prefilling or decoding)."""
        return len(self.running) + len(self.prefilling)

    def submit(self, request: Request) -> None:
        """Queue ``request``; QueueFull when max_batch + max_queue requests are already in; ValueError for ids
        a sequence cannot hold."""
        if not request.ids or len(request.ids) >= self.max_len:
            raise ValueError(f"a prompt must be 1 to {self.max_len - 1} tokens (max_model_len {self.max_len}, "
                             f"one left to answer), got {len(request.ids)}")
        with self.lock:
            if self.closing:
                raise RuntimeError("the scheduler is stopped")
            if len(self.waiting) + self.active >= self.max_batch + self.max_queue:
                raise QueueFull(f"{self.active} requests are running and {len(self.waiting)} waiting "
                                f"(--max-batch {self.max_batch}, --max-queue {self.max_queue})")
            self.waiting.append(request)
            self.lock.notify()

    def cancel(self, request: Request) -> None:
        """The client went away: ``request`` leaves at the next step (or never joins)."""
        request.cancelled = True

    def start(self) -> "Scheduler":
        self.thread = threading.Thread(target=self.run, name="qkv-serve-scheduler", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """End the thread; requests still in fail with "the server is stopping"."""
        with self.lock:
            self.closing = True
            self.lock.notify()
        if self.thread is not None:
            self.thread.join()

    def run(self) -> None:
        """The thread: admit, prefill a chunk, decode a token, until ``stop``."""
        with torch.no_grad(), self.plan.speed_layer(self.model):
            while True:
                with self.lock:
                    while not (self.closing or self.waiting or self.active):
                        self.lock.wait()
                    if self.closing:
                        break
                self.step()
        for request in [*self.running, *self.prefilling, *self.waiting]:
            request.fail("the server is stopping")
        self.running.clear()
        self.prefilling.clear()

    def step(self) -> None:
        """One scheduling step: admit, prefill, decode (each failure fails the requests it touched)."""
        for request in [r for r in (*self.running, *self.prefilling) if r.cancelled]:
            self.leave(request)
        self.admit()
        self.guarded(self.prefill, list(self.prefilling))
        self.guarded(self.decode, list(self.running))
        self.stats["max_blocks_used"] = max(self.stats["max_blocks_used"], self.blocks.used)

    def guarded(self, work, requests: list[Request]) -> None:
        """``work()``; an exception fails ``requests``, and the scheduler goes on."""
        try:
            work()
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the server
            for request in requests:
                if request in self.running or request in self.prefilling:
                    request.fail(f"{type(e).__name__}: {e}")
                    self.leave(request)

    def admit(self) -> None:
        """Waiting requests into rows while rows and blocks remain, sharing the cached blocks of their prefix."""
        while self.active < self.max_batch:
            with self.lock:
                if not self.waiting:
                    return
                request = self.waiting[0]
                if request.cancelled:
                    self.waiting.popleft()
                    continue
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
            with self.lock:
                self.waiting.popleft()
            self.prefilling.append(request)

    def prefill(self) -> None:
        """Prompts' next chunks, oldest first, ``max_prefill_tokens`` tokens in all; a finished prompt's first
        token is taken and it starts decoding."""
        budget = self.max_prefill_tokens
        while self.prefilling and budget > 0:
            request = self.prefilling[0]
            context = request.context
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

    def decode(self) -> None:
        """One token for every decoding row, each at its own position, in one forward."""
        for request in list(self.running):
            if request in self.running:
                self.make_room(request)
        if not self.running:
            return
        rows = list(self.running)
        ids = torch.tensor([[r.context[-1]] for r in rows], device=self.paged.device)  # (n, 1)
        logits = self.paged.forward(ids, [r.computed for r in rows], [r.blocks for r in rows])  # (n, V)
        for request in rows:
            request.computed += 1
            self.register(request)
        self.advance(rows, logits)

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
        with self.lock:
            self.waiting.appendleft(request)

    def register(self, request: Request) -> None:
        """``request``'s full blocks become shareable (their chained keys extended over its new tokens)."""
        request.keys = block_keys(request.context[:request.computed], self.block_size, request.keys)
        self.blocks.register(request.blocks, request.keys)

    def advance(self, rows: list[Request], logits: Tensor) -> None:
        """The rows take their tokens from logits (k, V); the finished ones leave."""
        tokens = pick(rows, logits).tolist()  # (k,)
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


def pick(rows: list[Request], logits: Tensor) -> Tensor:
    """Each row's next token from logits (k, V): greedy rows by argmax at once, sampled ones each with its own
    temperature, top_p and generator -> (k,)."""
    tokens = logits.argmax(-1)  # (k,)
    for i, request in enumerate(rows):
        s = request.settings
        if s.temperature > 0:
            top_p = s.top_p if s.top_p is not None and s.top_p < 1 else None
            tokens[i] = next_token(logits[i:i + 1], temperature=s.temperature, top_p=top_p,
                                   generator=request.generator)[0]
    return tokens
