"""The server's scheduler: one thread owns the model and a paged KV cache; at each step it decides who runs.

Each step (vLLM's scheduler, nano-vllm's in few lines):
1. waiting requests are admitted, oldest first, while a row is free and the blocks their prompt needs remain,
   besides one for each decoding row (blocks already holding the prompt's prefix, a chat template's system
   prompt, are shared, not recomputed);
2. admitted prompts are prefilled in chunks of at most ``max_prefill_tokens`` tokens a step, so that a long
   prompt does not stall the rows decoding (the blocks another prompt prefilled meanwhile are shared too; a
   short rest joins the decode step's forward, a row per token);
3. every decoding row takes one token, in one batched forward; a row that needs a new block when none is left
   preempts the newest request, whose blocks are freed and which is queued again first with its prompt and
   its tokens so far, to be recomputed (its full blocks stay cached, so mostly taken back).
A request finishes at an end id, a stop string, max_tokens or max_model_len, and frees its blocks.

The collaborators: ``WaitingQueue`` (waiting.py: submitted requests under the lock the thread sleeps on) and
``Batch`` (batch.py: the admitted requests, their blocks, admission, prefill, decode and preemption).
"""
from __future__ import annotations

import threading
from contextlib import nullcontext

import torch

from ..generation.paged import BLOCK_SIZE, PagedModel
from ..generation.plan import plan_serving
from ..kernels.linear import packed_weights
from .batch import Batch, next_tokens
from .request import QueueFull, Request, Settings
from .waiting import WaitingQueue

__all__ = ["QueueFull", "Request", "Scheduler", "Settings", "check_servable", "next_tokens"]


def check_servable(model) -> None:
    """ValueError unless ``model`` is a decoder (whose keys a paged cache may hold: the plan asks the registry's
    "paged" entry, ``plan_serving``)."""
    from ..models import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"serving needs a decoder (qkv.GPT), got {type(model).__name__}")


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
        self.max_prefill_tokens, self.block_size = max_prefill_tokens, block_size
        self.paged = PagedModel(model, self.plan.num_blocks, block_size=block_size, dtype=self.plan.dtype)
        self.waiting = WaitingQueue(max_batch, max_queue)
        self.batch = Batch(self.paged, self.waiting, max_batch=max_batch, max_len=max_model_len,
                           max_prefill_tokens=max_prefill_tokens)
        self.blocks, self.stats = self.paged.blocks, self.batch.stats
        self.running, self.prefilling = self.batch.running, self.batch.prefilling
        self.thread: threading.Thread | None = None  # the one running the loop
        self.stopped = threading.Event()  # the loop has ended

    @property
    def active(self) -> int:
        """Requests admitted now (prefilling or decoding)."""
        return len(self.batch)

    def submit(self, request: Request) -> None:
        """Queue ``request``; QueueFull when max_batch + max_queue requests are already in; ValueError for ids
        a sequence cannot hold."""
        if not request.ids or len(request.ids) >= self.max_len:
            raise ValueError(f"a prompt must be 1 to {self.max_len - 1} tokens (max_model_len {self.max_len}, "
                             f"one left to answer), got {len(request.ids)}")
        self.waiting.put(request, self.active)

    def cancel(self, request: Request) -> None:
        """The client went away: ``request`` leaves at the next step (or never joins)."""
        request.cancelled = True

    def start(self) -> "Scheduler":
        """Run the loop (``run``) in a thread of its own (tests, benchmarks, a notebook's server)."""
        self.thread = threading.Thread(target=self.run, name="qkv-serve-scheduler", daemon=True)
        self.thread.start()
        return self

    def claim(self) -> "Scheduler":
        """The calling thread will run the loop (``run``): no other starts it (the app's lifespan)."""
        self.thread = threading.current_thread()
        return self

    @property
    def started(self) -> bool:
        """Whether the loop runs (or ran), in its own thread (``start``) or in a caller's (``run``)."""
        return self.thread is not None

    def stop(self) -> None:
        """End the loop, wherever it runs, and wait for it; requests still in fail with "the server is
        stopping"."""
        self.waiting.close()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.stopped.wait()

    def run(self) -> None:
        """The loop: admit, prefill a chunk, decode a token, until ``stop`` (or an exception such as Ctrl-C's).
        ``qkv serve`` runs it in the thread that loaded the model (``qkv.serve.server.serve_forever``)."""
        self.thread = self.thread or threading.current_thread()
        rows = self.plan.packed_rows  # the plan's answer: 0 where the registry's "packed" refused
        try:
            with (torch.no_grad(), self.plan.speed_layer(self.model),
                  packed_weights(self.model, rows) if rows else nullcontext(), self.paged.decoding()):
                while self.waiting.wait(lambda: self.active > 0):
                    self.step()
        finally:
            self.waiting.close()
            for request in [*self.running, *self.prefilling, *self.waiting.drain()]:
                request.fail("the server is stopping")
            self.running.clear()
            self.prefilling.clear()
            self.stopped.set()

    def step(self) -> None:
        """One scheduling step: admit, prefill, decode (each failure fails the requests it touched)."""
        for request in [r for r in (*self.running, *self.prefilling) if r.cancelled]:
            self.batch.leave(request)
        self.batch.admit()
        self.guarded(self.batch.prefill, list(self.prefilling))
        self.guarded(self.batch.decode, list(self.running))
        self.stats["max_blocks_used"] = max(self.stats["max_blocks_used"], self.blocks.used)

    def guarded(self, work, requests: list[Request]) -> None:
        """``work()``; an exception fails ``requests``, and the scheduler goes on."""
        try:
            work()
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the server
            for request in requests:
                if self.batch.holds(request):
                    request.fail(f"{type(e).__name__}: {e}")
                    self.batch.leave(request)
