"""Tokenizers: one token per character, or byte-level BPE (GPT-2's scheme, trained with ``tokenizers``).

Both save to and load from one tokenizer.json; fitting BPE and encoding a corpus are remembered on
disk under a hash of their inputs (``qkv.runtime.cache_dir``).

Shapes: N tokens in a text.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch
from torch import Tensor

from ..fileio import atomic_text, atomic_write
from ..runtime import cache_dir

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")  # sequence-to-sequence tokenizers: ids 0, 1, 2


class TokenizerBase:
    """What both tokenizers share: checking ids, each token's text, saving tokenizer.json (``to_json``)."""

    vocab_size: int

    def checked_ids(self, ids) -> list[int]:
        """``ids`` (a tensor or a sequence) as a list, each in [0, vocab_size) (ValueError naming the first)."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return ids

    def token_strings(self, ids) -> list[str]:
        """Each token's text, for labels (BPE: a token holding part of a multi-byte character shows as '�')."""
        return [self.decode([i]) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]

    def save(self, directory: str | os.PathLike) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        atomic_text(path, self.to_json())
        return path


class CharTokenizer(TokenizerBase):
    """One token per Unicode character of a fixed vocabulary (sorted, so ids are stable)."""

    kind = "char"

    def __init__(self, chars: str | list[str]) -> None:
        chars = sorted(set(chars))
        if not chars or any(len(c) != 1 for c in chars):
            raise ValueError("a character vocabulary needs at least one single-character entry")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}
        self._codepoints = torch.tensor([ord(c) for c in chars], dtype=torch.int64)  # sorted

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        """The vocabulary of every character in ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return self.encode_tensor(text).tolist()

    def encode_tensor(self, text: str) -> Tensor:
        """text -> int64 ids (N,), vectorised (the corpus has millions of characters)."""
        cps = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()  # (N,)
        ids = torch.searchsorted(self._codepoints, cps).clamp(max=len(self.chars) - 1)
        unknown = self._codepoints[ids] != cps
        if bool(unknown.any()):
            bad = sorted({chr(c) for c in cps[unknown].tolist()})
            shown = ", ".join(repr(c) for c in bad[:10]) + (" …" if len(bad) > 10 else "")
            raise ValueError(f"{len(bad)} character(s) outside the tokenizer's {self.vocab_size}-character "
                             f"vocabulary: {shown}")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in self.checked_ids(ids))

    def to_json(self) -> str:
        return json.dumps({"qkv_tokenizer": "char", "chars": "".join(self.chars)}, ensure_ascii=False)


class BPETokenizer(TokenizerBase):
    """Byte-level BPE (GPT-2's scheme) trained with Hugging Face ``tokenizers``: any text encodes."""

    kind = "bpe"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: str | list[str], vocab_size: int = 1024, *, max_chars: int | None = 2_000_000,
              special_tokens: tuple[str, ...] = ()) -> "BPETokenizer":
        """Learn ``vocab_size`` − 256 merges on top of the 256 byte tokens, from at most ``max_chars``
        characters spread evenly over the text (merge statistics settle on a sample of a few million
        characters). ``special_tokens`` (e.g. ``SPECIAL_TOKENS``) take ids 0, 1, … and are never split or merged."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if not isinstance(vocab_size, int) or not 257 <= vocab_size <= 1 << 20:
            raise ValueError(f"BPE vocab_size must be an int in [257, {1 << 20}], got {vocab_size!r}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=list(special_tokens), show_progress=False)
        pieces = list(_chunks([texts] if isinstance(texts, str) else texts))
        total = sum(len(p) for p in pieces)
        if max_chars and total > max_chars:
            pieces = pieces[:: math.ceil(total / max_chars)]  # every k-th 64 K piece, deterministic
        tok.train_from_iterator(pieces, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def special_id(self, token: str) -> int | None:
        """The id of a special token (``SPECIAL_TOKENS``), None if this tokenizer has none."""
        return self.tokenizer.token_to_id(token)

    @property
    def pad_id(self) -> int | None:
        return self.special_id(SPECIAL_TOKENS[0])

    @property
    def bos_id(self) -> int | None:
        return self.special_id(SPECIAL_TOKENS[1])

    @property
    def eos_id(self) -> int | None:
        return self.special_id(SPECIAL_TOKENS[2])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_tensor(self, text: str) -> Tensor:
        """text -> int64 ids (N,), encoded in line-aligned chunks in parallel."""
        encs = self.tokenizer.encode_batch(list(_chunks([text])))
        return torch.tensor([i for e in encs for i in e.ids], dtype=torch.int64)

    def decode(self, ids) -> str:
        """ids -> text; special tokens (padding, start, end) are left out."""
        return self.tokenizer.decode(self.checked_ids(ids))

    def to_json(self) -> str:
        return self.tokenizer.to_str()


def _chunks(texts: list[str], size: int = 1 << 16):
    """Pieces of about ``size`` characters, cut after a line break."""
    for text in texts:
        start = 0
        while start < len(text):
            end = text.find("\n", start + size)
            end = len(text) if end < 0 else end + 1
            yield text[start:end]
            start = end


def train_tokenizer(kind: str, text: str, *, vocab_size: int | None = None):
    """A new tokenizer of ``kind`` (char | bpe) fitted to ``text``."""
    if kind == "char":
        if vocab_size is not None:
            raise ValueError("--vocab-size applies to --tokenizer bpe; a character vocabulary is the text's characters")
        return CharTokenizer.train(text)
    if kind == "bpe":
        return BPETokenizer.train(text, 1024 if vocab_size is None else vocab_size)
    raise ValueError(f"tokenizer must be 'char' or 'bpe', got {kind!r}")


def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()[:32]


def _cached(name: str, make, load, save):
    """``load(path)`` if the cache has ``name``, else ``make()`` (saved best-effort)."""
    d = cache_dir()
    path = d / name if d else None
    if path is not None and path.is_file():
        try:
            return load(path)
        except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed, never trusted
            pass
    value = make()
    if path is not None:
        try:
            d.mkdir(parents=True, exist_ok=True)
            save(value, path)
        except OSError:
            pass
    return value


def fit_tokenizer(kind: str, text: str, *, vocab_size: int | None = None):
    """``train_tokenizer``, remembered on disk under a hash of its inputs (BPE takes seconds)."""
    if kind != "bpe":
        return train_tokenizer(kind, text, vocab_size=vocab_size)
    return _cached(f"bpe-{_key(kind, str(vocab_size), text)}.json",
                   lambda: train_tokenizer(kind, text, vocab_size=vocab_size),
                   lambda p: tokenizer_from_json(p.read_text(encoding="utf-8")),
                   lambda tok, p: atomic_text(p, tok.to_json()))


def encode_corpus(tokenizer, text: str) -> Tensor:
    """``tokenizer.encode_tensor(text)``, remembered on disk under a hash of both: BPE-encoding the
    11 M-character corpus takes a minute on a busy CPU, characters a second (not cached)."""
    if tokenizer.kind == "char":
        return tokenizer.encode_tensor(text)

    def load(path: Path) -> Tensor:
        from safetensors.torch import load_file

        return load_file(str(path))["ids"].long()

    def save(ids: Tensor, path: Path) -> None:
        from safetensors.torch import save as st_save

        atomic_write(path, st_save({"ids": ids.to(torch.int32)}))

    return _cached(f"ids-{_key(tokenizer.to_json(), text)}.safetensors", lambda: tokenizer.encode_tensor(text),
                   load, save)


def tokenizer_from_json(text: str):
    """Rebuild a tokenizer from ``to_json()`` output."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"tokenizer file is not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(obj, dict) and obj.get("qkv_tokenizer") == "char" and isinstance(obj.get("chars"), str):
        return CharTokenizer(obj["chars"])
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict) and obj["model"].get("type") == "BPE":
        from tokenizers import Tokenizer

        try:
            return BPETokenizer(Tokenizer.from_str(text))
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type
            raise ValueError(f"invalid BPE tokenizer file: {e}") from None
    raise ValueError("tokenizer file is neither a qkv character vocabulary nor a byte-level BPE tokenizer")


def load_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in ``directory`` (its tokenizer.json)."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise ValueError(f"{directory} has no {TOKENIZER_FILE}")
    return tokenizer_from_json(path.read_text(encoding="utf-8"))
