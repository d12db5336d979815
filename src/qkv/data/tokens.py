"""Text → token ids and one readable label per token: what the claims, the figures and the
explorer show a reader.

A tokenizer here is anything with ``encode(text) -> list[int]`` and either
``token_strings(ids) -> list[str]`` (qkv's tokenizers, qkv.interop's Hugging Face wrapper)
or ``decode(ids) -> str``. Imports nothing from qkv.

Byte-level BPE (GPT-2's scheme, qkv's ``bpe`` tokenizer) cuts a Chinese character (3 bytes in
UTF-8) into byte tokens; decoding one alone gives '�'. Such a token is labelled by its bytes
instead, ``<e5 a4>``, recovered from its vocabulary string through GPT-2's byte ↔ character
table (or from SentencePiece's ``<0xE5>`` byte tokens). No label ever shows '�'.

Shapes: T tokens.
"""
from __future__ import annotations

import itertools
import operator
import re
from typing import Any, Sequence

REPLACEMENT = "\ufffd"  # what a lossy UTF-8 decoder puts for bytes that are not a whole character
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback (LLaMA, Marian …)


def gpt2_byte_table() -> dict[int, str]:
    """GPT-2's byte → printable character table (``bytes_to_unicode`` in its encoder.py): printable
    Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 … U+0143 in order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


BYTE_OF_CHAR = {c: b for b, c in gpt2_byte_table().items()}


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One display string per id: ``token_strings`` where the tokenizer has it, else ``decode([id])``;
    a token holding part of a character shows as its bytes (``<e5 a4>``), never as '�'."""
    ids = [operator.index(i) for i in ids]  # ints, numpy ints, integer tensors; never a float truncated
    if hasattr(tokenizer, "token_strings"):
        labels = tokenizer.token_strings(ids)
    else:
        labels = [tokenizer.decode([i]) for i in ids]
    return [readable_label(tokenizer, i, str(s)) for i, s in zip(ids, labels)]


def readable_label(tokenizer: Any, token_id: int, label: str) -> str:
    """``label`` for token ``token_id``, or its bytes when it holds part of a character; never '�'."""
    raw = vocabulary_string(tokenizer, token_id)
    decode = getattr(tokenizer, "decode", None)
    data = None if raw is None else token_bytes(raw, decoded=decode([token_id]) if decode else None)
    if data is not None and REPLACEMENT in data.decode("utf-8", "replace"):
        return bytes_label(data)
    if REPLACEMENT not in label:
        return label
    if raw and REPLACEMENT not in raw:
        return raw  # bytes unknown: the vocabulary's own string
    return label.replace(REPLACEMENT, "<?>")


def vocabulary_string(tokenizer: Any, token_id: int) -> str | None:
    """Token ``token_id`` as the vocabulary spells it (GPT-2: 'Ġthe', 'å¤'), or None where the tokenizer
    does not say: read from a ``transformers`` or ``tokenizers`` backend (qkv's BPE, qkv.interop's wrapper)."""
    for backend in (tokenizer, getattr(tokenizer, "backend", None), getattr(tokenizer, "tokenizer", None)):
        if hasattr(backend, "convert_ids_to_tokens"):
            raw = backend.convert_ids_to_tokens(token_id)
        elif hasattr(backend, "id_to_token"):
            raw = backend.id_to_token(token_id)
        else:
            continue
        return raw if isinstance(raw, str) else None
    return None


def token_bytes(raw: str, *, decoded: str | None) -> bytes | None:
    """The bytes a vocabulary string stands for, or None: a SentencePiece byte token ``<0xE5>``, or a
    byte-level string (GPT-2's table) whose lossy UTF-8 decoding is the tokenizer's own ``decoded``
    text (which tells a byte-level vocabulary from one that merely holds Latin-1 letters)."""
    byte = BYTE_TOKEN.fullmatch(raw)
    if byte:
        return bytes.fromhex(byte[1])
    if decoded is None or not raw or not all(c in BYTE_OF_CHAR for c in raw):
        return None
    data = bytes(BYTE_OF_CHAR[c] for c in raw)
    return data if data.decode("utf-8", "replace") == decoded else None


def bytes_label(data: bytes) -> str:
    """UTF-8 bytes as text, each run of bytes that is no whole character as ``<e5 a4>``."""
    pieces: list[str | bytes] = []
    while data:
        try:
            pieces.append(data.decode("utf-8"))
            break
        except UnicodeDecodeError as e:  # e.start … e.end: bytes that are not (all of) a character
            pieces += [data[:e.start].decode("utf-8"), data[e.start:e.end]]
            data = data[e.end:]
    runs = itertools.groupby((p for p in pieces if p), key=lambda p: isinstance(p, bytes))
    return "".join("<" + b"".join(run).hex(" ") + ">" if stray else "".join(run) for stray, run in runs)


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
