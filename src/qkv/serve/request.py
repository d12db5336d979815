"""A request as the scheduler sees it: its ids, how it decodes (``Settings``), its answer so far, and where its
keys and values are (``blocks``, ``computed``), and the refusal when the server is full (``QueueFull``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

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
    """One prompt's ids decoding in the batch. ``on_event(text, finish_reason)`` is called from the scheduler's
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
        self.blocks: list[int] = []  # the paged cache's blocks holding its context, in order
        self.computed = 0  # the tokens of its context whose keys and values are in its blocks
        self.keys: list[int] = []  # the chained keys of its full blocks (``qkv.generation.blocks``)

    @property
    def context(self) -> list[int]:
        """Its prompt and its tokens so far: what is recomputed after a preemption."""
        return self.ids + self.tokens

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
