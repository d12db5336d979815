"""Streaming: ``generate(..., streamer=)`` hands each new token to a streamer as it is chosen.

A streamer is Hugging Face's protocol: ``put(ids)`` with the prompt (B, T) first, then the new tokens
(B, k) of every row as they are chosen (k is 1, or a few when the fused step takes several greedy tokens
in one call), and ``end()`` once generation is over. Streaming changes nothing of what is generated.

``TextStreamer`` writes the text of one sequence as it grows. Tokens are pieces of bytes, not of
characters: a byte-level BPE token can end in the middle of a character (one Chinese character is three
bytes of UTF-8), and a tokenizer may decode a token differently after another one (SentencePiece drops
the leading space of the first word only). So it decodes the tokens together and writes only the text
that is newly complete: what has been written never changes, and all of it is the decoded sequence.

Shapes: B batch, T prompt length, k new tokens.
"""
from __future__ import annotations

import sys
from typing import Callable, Protocol

from torch import Tensor

INCOMPLETE = "\ufffd"  # what a decoder gives for the first bytes of a character whose last byte is still to come


class Streamer(Protocol):
    """What ``generate(..., streamer=)`` calls: Hugging Face's ``BaseStreamer`` protocol."""

    def put(self, ids: Tensor) -> None: ...

    def end(self) -> None: ...


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout at once (flushed)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def token_list(ids) -> list[int]:
    """The ids of one sequence from a (1, k) or (k,) tensor or a list; ValueError for a batch."""
    if isinstance(ids, Tensor):
        if ids.dim() == 2 and ids.size(0) != 1:
            raise ValueError(f"TextStreamer writes one sequence; generate was given a batch of {ids.size(0)} rows")
        return ids.reshape(-1).tolist()
    return [int(i) for i in ids]


class TextStreamer:
    """Writes the text of the tokens ``generate`` hands it, as they come.

    Args:
        tokenizer: ``decode(ids) -> str``.
        write: where the text goes, piece by piece (default: stdout, flushed).
        skip_prompt: leave out the prompt (the first ``put``): write only the new text.
        window: tokens decoded together at most; past it the streamer keeps the last ``context`` of them
            as the start of the next window, so each token costs the same however long the text grows.

    ``text`` is everything written so far.
    """

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def __init__(self, tokenizer, *, write: Callable[[str], object] | None = None, skip_prompt: bool = False,
                 window: int = 64, context: int = 8) -> None:
        if not 0 < context < window:
            raise ValueError(f"need 0 < context < window, got context={context}, window={window}")
        self.tokenizer, self.write = tokenizer, write or write_stdout
        self.skip_prompt, self.window, self.context = skip_prompt, window, context
        self.tokens: list[int] = []  # decoded together: the context kept, then the new tokens
        self.shown = 0  # characters of decode(self.tokens) already written (or skipped)
        self.prompt_seen = False
        self.pieces: list[str] = []

    def put(self, ids) -> None:
        """The prompt (first call), then each step's new token(s)."""
        first, self.prompt_seen = not self.prompt_seen, True
        self.tokens.extend(token_list(ids))
        text = self.tokenizer.decode(self.tokens)
        ready = text.rstrip(INCOMPLETE)  # a character's first bytes wait for the rest
        if first and self.skip_prompt:
            self.shown = len(ready)
        elif len(ready) > self.shown:
            self.emit(ready[self.shown:])
            self.shown = len(ready)
        if len(self.tokens) > self.window and ready == text:
            self.tokens = self.tokens[-self.context:]  # decoded as before, the text so far as the context
            self.shown = len(self.tokenizer.decode(self.tokens))

    def end(self) -> None:
        """Write what is left (a character never completed decodes as U+FFFD, as the whole text would)."""
        text = self.tokenizer.decode(self.tokens)
        if len(text) > self.shown:
            self.emit(text[self.shown:])
        self.tokens, self.shown, self.prompt_seen = [], 0, False

    def emit(self, piece: str) -> None:
        self.pieces.append(piece)
        self.write(piece)
