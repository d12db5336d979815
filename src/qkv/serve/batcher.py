"""Continuous batching: one thread owns the model; requests join the running batch at any step and leave when done.

The batch's KV caches hold R rows of M slots (M = the model's max_len), one ``KVCache`` (R, G, M, D) per layer
(a sliding-window layer: a ``RingKVCache`` (R, G, W, D), each row's slot p at ring slot p mod W; an MLA layer:
a ``LatentCache`` (R, 1, M, d_c + d_R)).
The n requests running occupy rows 0 … n − 1 (kept packed: a finished row is replaced by the last one). Row b
holds its tokens in slots 0 … len_b − 1 and each step writes its newest token at slot len_b — per-row
``input_pos`` (n, 1), so every row decodes as it would alone, whatever the others' lengths. A new request is
prefilled alone into row n (a view of that row, ``KVCache.rows``) and takes part in the next step.
(vLLM's scheduler, without its pages: a row is a request's whole context.)

Shapes: R rows at most (max_batch), n rows running, M slots per row, P prompt length, V vocabulary.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..generation import next_token
from ..generation.backends import speed_layer
from ..nn.kv_cache import RingKVCache
from .text import Answer


class QueueFull(Exception):
    """The batch and the queue are full: the request is refused (HTTP 429)."""


@dataclass(frozen=True)
class Settings:
    """How one request decodes (OpenAI's fields): 0 = greedy; ``eos_ids`` end it (not part of the text)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    eos_ids: frozenset[int] = frozenset()


class Request:
    """One prompt's ids decoding in the batch. ``on_event(text, finish_reason)`` is called from the batcher's
    thread with each new piece of text and once at the end (finish_reason "stop", "length" or "error")."""

    def __init__(self, ids: list[int], settings: Settings, decode: Callable[[list[int]], str],
                 on_event: Callable[[str, str | None], None]) -> None:
        self.ids, self.settings, self.on_event = list(ids), settings, on_event
        self.answer = Answer(decode, settings.stop)
        self.tokens: list[int] = []  # generated, an end-of-sequence id included
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.cancelled = False  # the client went away: its row is freed at the next step
        self.generator: torch.Generator | None = None  # its own, when it has a seed

    def take(self, token: int, room: int) -> bool:
        """``token`` generated, ``room`` slots left in its row -> whether the answer is complete."""
        self.tokens.append(token)
        if token in self.settings.eos_ids:
            reason = "stop"
        else:
            self.answer.add(token)
            full = len(self.tokens) >= self.settings.max_tokens or room <= 0
            reason = "stop" if self.answer.stopped else "length" if full else None
        if reason is not None:
            self.answer.finish()
            self.finish_reason = reason
        text = self.answer.take()
        if text or reason is not None:
            self.on_event(text, reason)
        return reason is not None

    def fail(self, message: str) -> None:
        self.error, self.finish_reason = message, "error"
        self.on_event("", "error")


def check_servable(model) -> None:
    """ValueError unless ``model`` is a decoder the batch decodes row by row: a GPT whose every layer keeps a
    ``KVCache``, a sliding window's ``RingKVCache`` or MLA's ``LatentCache`` (each writes every row at its own
    slot) and whose positions are not a bias over shared key places."""
    from ..models import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"serving needs a decoder (qkv.GPT), got {type(model).__name__}")
    kinds = {type(c).__name__ for c in model.new_kv_caches(1, 1)} - {"KVCache", "RingKVCache", "LatentCache"}
    if kinds:
        raise ValueError(f"the batch decodes rows of different lengths with a KVCache, RingKVCache or LatentCache "
                         f"per layer; this model keeps {', '.join(sorted(kinds))} (attention.kind "
                         f"{model.config.attention.kind}): not served")
    if model.config.position.kind in ("alibi", "t5"):
        raise ValueError(f"the batch decodes rows of different lengths; position.kind "
                         f"{model.config.position.kind} is a bias over shared key places: not served")


class Batcher:
    """The scheduler and its thread: ``submit`` a Request, tokens come through its ``on_event``.

    At most ``max_batch`` requests decode together; ``max_queue`` more wait; past that ``submit`` raises QueueFull.
    ``backend``: "auto" (the linears through qkv's CPU kernels, as ``generate``) or "eager".
    """

    def __init__(self, model, *, max_batch: int = 32, max_queue: int = 64, backend: str = "auto") -> None:
        check_servable(model)
        if max_batch < 1 or max_queue < 0 or backend not in ("auto", "eager"):
            raise ValueError(f"need max_batch >= 1, max_queue >= 0, backend auto or eager, got {max_batch}, "
                             f"{max_queue}, {backend!r}")
        self.model, self.backend = model.eval(), backend
        self.max_batch, self.max_queue, self.max_len = max_batch, max_queue, model.config.max_len
        self.device = model.lm_head.weight.device
        R, M = max_batch, self.max_len
        caches: list = model.new_kv_caches(R, M)  # KVCache, RingKVCache or LatentCache per layer
        self.caches = caches
        self.slots = torch.zeros(R, M, dtype=torch.bool, device=self.device)  # (R, M): True where a token sits
        self.lengths = torch.zeros(R, dtype=torch.long, device=self.device)  # (R,): tokens each row holds
        self.last = torch.zeros(R, dtype=torch.long, device=self.device)  # (R,): each row's next input
        self.slot_ids = torch.arange(M, device=self.device)
        self.first_rows = [[c.rows(0, n) for c in caches] for n in range(1, R + 1)]  # [n - 1]: rows 0 … n − 1
        self.one_row = [[c.rows(b, b + 1) for c in caches] for b in range(R)]  # [b]: row b alone
        self.rows: list[Request] = []  # row b decodes rows[b]
        self.waiting: deque[Request] = deque()
        self.lock = threading.Condition()
        self.closing, self.thread = False, None

    @property
    def active(self) -> int:
        """Requests decoding now (rows in use)."""
        return len(self.rows)

    def submit(self, request: Request) -> None:
        """Queue ``request``; QueueFull when max_batch + max_queue requests are already in; ValueError for ids
        the rows cannot hold."""
        if not request.ids or len(request.ids) >= self.max_len:
            raise ValueError(f"a prompt must be 1 to {self.max_len - 1} tokens (the model's max_len "
                             f"{self.max_len}, one left to answer), got {len(request.ids)}")
        with self.lock:
            if self.closing:
                raise RuntimeError("the batcher is stopped")
            if len(self.waiting) + len(self.rows) >= self.max_batch + self.max_queue:
                raise QueueFull(f"{self.max_batch} requests are decoding and {len(self.waiting)} waiting "
                                f"(--max-batch {self.max_batch}, --max-queue {self.max_queue})")
            self.waiting.append(request)
            self.lock.notify()

    def cancel(self, request: Request) -> None:
        """The client went away: ``request``'s row is freed at the next step (or it never joins)."""
        request.cancelled = True

    def start(self) -> "Batcher":
        self.thread = threading.Thread(target=self.run, name="qkv-serve-batcher", daemon=True)
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
        """The thread: take the waiting requests that fit, step the batch, until ``stop``."""
        with torch.no_grad(), speed_layer(self.model, self.backend):
            while True:
                with self.lock:
                    while not (self.closing or self.waiting or self.rows):
                        self.lock.wait()
                    if self.closing:
                        break
                    joining = [self.waiting.popleft() for _ in range(min(len(self.waiting),
                                                                         self.max_batch - len(self.rows)))]
                for request in joining:
                    self.guarded(self.join, request)
                if self.rows:
                    self.guarded(self.step)
        for request in [*self.rows, *self.waiting]:
            request.fail("the server is stopping")
        self.rows.clear()

    def guarded(self, work, *args) -> None:
        """``work(*args)``; an exception fails the requests it touched, and the batcher goes on."""
        try:
            work(*args)
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the server
            for request in args or list(self.rows):
                request.fail(f"{type(e).__name__}: {e}")
                if request in self.rows:
                    self.free(self.rows.index(request))

    def join(self, request: Request) -> None:
        """Prefill ``request`` alone into row n and take its first token."""
        if request.cancelled:
            return
        b, P = len(self.rows), len(request.ids)
        self.slots[b].zero_()
        self.slots[b, :P] = True
        ids = torch.tensor([request.ids], device=self.device)  # (1, P)
        logits = self.model(ids, mask=self.slots[b:b + 1], kv_caches=self.one_row[b], input_pos=self.slot_ids[:P],
                            logits_to_keep=1).logits[:, -1]  # (1, V)
        self.lengths[b] = P
        self.rows.append(request)
        if request.settings.seed is not None:
            request.generator = torch.Generator(device=self.device).manual_seed(request.settings.seed)
        self.advance(b, logits)

    def step(self) -> None:
        """One token for every running row, each at its own slot."""
        for b in reversed(range(len(self.rows))):
            if self.rows[b].cancelled:
                self.free(b)
        n = len(self.rows)
        if n == 0:
            return
        pos = self.lengths[:n, None]  # (n, 1): each row's next slot
        self.slots[:n].scatter_(1, pos, True)
        logits = self.model(self.last[:n, None], mask=self.slots[:n], kv_caches=self.first_rows[n - 1],
                            input_pos=pos, logits_to_keep=1).logits[:, -1]  # (n, V)
        self.lengths[:n] += 1
        self.advance(0, logits)

    def advance(self, start: int, logits: Tensor) -> None:
        """Rows start … start + k − 1 take their tokens from logits (k, V); the finished ones leave."""
        rows = self.rows[start:start + logits.size(0)]
        tokens = pick(rows, logits)  # (k,)
        self.last[start:start + len(rows)] = tokens
        room = (self.max_len - self.lengths[start:start + len(rows)]).tolist()
        done = [b for b, (request, token, r) in enumerate(zip(rows, tokens.tolist(), room), start)
                if request.take(token, r)]
        for b in reversed(done):
            self.free(b)

    def free(self, b: int) -> None:
        """Row b leaves; the last row moves into it (its filled slots copied), so rows 0 … n − 2 stay in use."""
        last = len(self.rows) - 1
        if b != last:
            used = min(int(self.lengths[last]), self.max_len)
            for cache in self.caches:
                move_row(cache, last, b, used)
            for state in (self.slots, self.lengths, self.last):
                state[b] = state[last]
            self.rows[b] = self.rows[last]
        self.slots[last] = False
        self.rows.pop()


def move_row(cache, src: int, dst: int, used: int) -> None:
    """Row ``src`` of a layer's cache into row ``dst``: its first ``used`` slots (k, v (R, G, M, D) of a
    ``KVCache``; kv (R, 1, M, d_c + d_R) of a ``LatentCache``), a ring's W slots whole (places mod W)."""
    n = cache.k.size(2) if isinstance(cache, RingKVCache) else used
    for name in ("kv",) if hasattr(cache, "kv") else ("k", "v"):
        buffer = getattr(cache, name)
        buffer[dst, :, :n] = buffer[src, :, :n]  # (G, n, ·)


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
