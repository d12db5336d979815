"""Text → token ids and one readable label per token: what the claims, the figures and the
explorer show a reader.

A tokenizer here is anything with ``encode(text) -> list[int]`` and either
``token_strings(ids) -> list[str]`` (qkv's tokenizers, qkv.interop's Hugging Face wrapper)
or ``decode(ids) -> str``. Imports nothing from qkv.

Shapes: T tokens.
"""
from __future__ import annotations

from typing import Any, Sequence


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One display string per id: ``token_strings`` where the tokenizer has it, else ``decode([id])``."""
    if hasattr(tokenizer, "token_strings"):
        labels = tokenizer.token_strings(list(ids))
    else:
        labels = [tokenizer.decode([i]) for i in ids]
    return [str(s) for s in labels]


def encode_text(tokenizer: Any, text: str, *, max_len: int | None = None) -> tuple[list[int], list[str]]:
    """text -> (ids (T,), T labels).

    TypeError for a non-str text; ValueError for an empty text, T > ``max_len`` (None: no bound),
    and — from the tokenizer itself — characters outside its vocabulary.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("the text is empty; give at least one character")
    ids = [int(i) for i in tokenizer.encode(text)]  # ValueError for characters outside the vocabulary
    if max_len is not None and len(ids) > max_len:
        raise ValueError(f"the text is {len(ids)} tokens but the model's max_len is {max_len}; shorten it")
    return ids, token_labels(tokenizer, ids)
