"""Token labels a reader can read: what the figures and the explorer put beside each row and column.

``qkv.data.tokens.token_labels`` shows a token that holds only part of a character by its bytes
(``<e7 8b>``): exact, but a Chinese reader looking at 狗咬人 through a byte-level BPE sees nine
byte escapes. Here each such token is named by the character it is part of and its piece
number among the tokens that character is spread over — 狗₁ 狗₂ 狗₃ for one token per byte —
so every row and column stays one token (the maps are not changed) and the text reads
through. Bytes that belong to no character (a window cut mid-character) keep their escape.

    ids → token bytes (tokens.token_bytes) → characters and the tokens each spans → labels

Shapes: T tokens.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..data.tokens import REPLACEMENT, bytes_label, encode_text, token_bytes, token_labels, vocabulary_string

SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def piece_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The UTF-8 bytes token ``token_id`` stands for when the tokenizer says (byte-level BPE,
    SentencePiece byte tokens), else None."""
    raw = vocabulary_string(tokenizer, token_id)
    decode = getattr(tokenizer, "decode", None)
    return None if raw is None else token_bytes(raw, decoded=decode([token_id]) if decode else None)


def characters(data: bytes) -> list[tuple[int, int, str | None]]:
    """(start, end, character) for each UTF-8 character of ``data``; a stray byte is (i, i + 1, None)."""
    spans, i = [], 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 0
        chunk = data[i:i + size]
        try:
            char = chunk.decode("utf-8") if size and len(chunk) == size else None
        except UnicodeDecodeError:  # a bad continuation byte, a surrogate, an overlong form
            char = None
        size = size if char is not None else 1
        spans.append((i, i + size, char))
        i += size
    return spans


def piece_label(start: int, end: int, chars: list[tuple[int, int, str | None]], data: bytes,
                owners: dict[int, list[int]], token: int) -> str:
    """The label of the token holding bytes start … end: whole characters as they are, a character
    it holds only part of with its piece number (狗₂), stray bytes as ``<97>``."""
    out = []
    for s, e, c in chars:
        if e <= start or s >= end:
            continue
        if c is None:
            out.append(bytes_label(data[s:e]))
        elif start <= s and e <= end:
            out.append(c)
        else:
            out.append(c + str(owners[s].index(token) + 1).translate(SUBSCRIPT))
    return "".join(out).replace("><", " ")  # adjacent stray bytes read as one escape: <e5 a4>


def readable_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """``token_labels``, except that a token holding part of a character is named by that character
    and its piece number (狗₁ 狗₂ 狗₃) instead of its bytes; tokens of whole characters are unchanged."""
    labels = token_labels(tokenizer, ids)
    pieces = [piece_bytes(tokenizer, int(i)) for i in ids]
    if all(whole(p) for p in pieces):
        return labels  # no token splits a character
    spans, data = [], b""
    for label, piece in zip(labels, pieces):
        piece = label.encode("utf-8") if piece is None else piece
        spans.append((len(data), len(data) + len(piece)))
        data += piece
    chars = characters(data)
    owners = {s: [t for t, (a, b) in enumerate(spans) if a < e and s < b] for s, e, _ in chars}
    return [label if whole(piece) else piece_label(a, b, chars, data, owners, t)
            for t, (label, piece, (a, b)) in enumerate(zip(labels, pieces, spans))]


def whole(piece: bytes | None) -> bool:
    """True unless ``piece`` holds part of a character (None: bytes unknown, taken as whole)."""
    return piece is None or REPLACEMENT not in piece.decode("utf-8", "replace")

def readable_tokens(tokenizer: Any, text: str, *, max_len: int | None = None) -> tuple[list[int], list[str]]:
    """``tokens.encode_text`` (its checks and errors) with ``readable_labels``: text -> (ids (T,), T labels)."""
    ids, _ = encode_text(tokenizer, text, max_len=max_len)
    return ids, readable_labels(tokenizer, ids)
