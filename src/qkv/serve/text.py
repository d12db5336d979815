"""A request's answer as text while its tokens come: whole characters only, and held back while it could be the
start of a stop string (OpenAI's ``stop``: the answer ends before the first one, which is not part of it).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

from ..generation import TextStreamer


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string (the longest such suffix)."""
    longest = max((len(s) for s in stops), default=1) - 1
    return next((n for n in range(min(longest, len(text)), 0, -1) if any(s.startswith(text[-n:]) for s in stops)), 0)


class Answer:
    """Tokens in (``add``), text out (``take``): the text so far that no stop string can still claim.

    ``stopped`` turns True when a stop string appears; the text before it is the whole answer.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""  # decoded, not yet released: it could begin a stop string
        self.ready: list[str] = []  # released, not yet taken
        self.parts: list[str] = []  # everything released
        self.stopped = False
        self.streamer = TextStreamer(SimpleNamespace(decode=decode), write=self.decoded)

    def add(self, token: int) -> None:
        """One generated token (not an end-of-sequence one: that is no text)."""
        if not self.stopped:
            self.streamer.put([token])

    def finish(self) -> None:
        """The answer is complete: what was held back is released (a character never completed is U+FFFD)."""
        if not self.stopped:
            self.streamer.end()
            self.release(self.pending)
            self.pending = ""

    def take(self) -> str:
        """The text released since the last ``take``."""
        out, self.ready = "".join(self.ready), []
        return out

    def decoded(self, piece: str) -> None:
        if self.stopped:
            return
        text = self.pending + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.release(text[:min(hits)])
            self.pending, self.stopped = "", True
            return
        keep = held_back(text, self.stops)
        self.release(text[:len(text) - keep])
        self.pending = text[len(text) - keep:]

    def release(self, text: str) -> None:
        if text:
            self.ready.append(text)
            self.parts.append(text)

    @property
    def text(self) -> str:
        """Everything released so far."""
        return "".join(self.parts)
