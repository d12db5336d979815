"""A checkpoint's tokenizer behind the small interface qkv's commands use, and finding it in a directory."""
from __future__ import annotations

import operator
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from ...generation.beam_search import Special
from .files import read_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


class Tokenizer:
    """A checkpoint's tokenizer behind the small interface qkv's commands use.

    Wraps a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. ``encode`` adds the
    special tokens the tokenizer is configured to add (LLaMA's <s>, BERT's [CLS] … [SEP]);
    ``decode`` keeps special tokens, so ids and text correspond one to one.

    An encoder-decoder's tokenizer carries ``special`` (a ``qkv.beam_search.Special``: where
    decoding starts, stops and pads). Then ``encode`` gives the text's ids alone and ``decode``
    drops special tokens: the search places start and EOS itself (``translate_texts``).
    """

    def __init__(self, backend, *, eos_id: int | None = None, special: Special | None = None) -> None:
        self.backend, self.special = backend, special
        self._hf = hasattr(backend, "convert_ids_to_tokens")  # transformers; else tokenizers
        own_eos = getattr(backend, "eos_token_id", None) if self._hf else None
        self.eos_id: int | None = own_eos if own_eos is not None else eos_id

    @property
    def vocab_size(self) -> int:
        """Every id encode can return, added tokens included."""
        return len(self.backend) if self._hf else self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=self.special is None)
        return list(ids) if self._hf else ids.ids

    def decode(self, ids) -> str:
        ids = self._check(ids)
        return self.backend.decode(ids, skip_special_tokens=self.special is not None)

    def decode_text(self, ids) -> str:
        """The text of ``ids`` without special tokens: a chat reply without its template's markup."""
        return self.backend.decode(self._check(ids), skip_special_tokens=True)

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's chat template (tokenizer_config.json's 'chat_template', or chat_template.jinja);
        None without one, and for a bare ``tokenizers.Tokenizer``."""
        template = getattr(self.backend, "chat_template", None) if self._hf else None
        return template or None

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A conversation ([{"role": "system" | "user" | …, "content": text}, …]) formatted with the chat
        template and opening the assistant's turn: ``apply_chat_template(messages, add_generation_prompt=True)``'s
        ids. ValueError when the tokenizer has no template."""
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json 'chat_template')")
        out = self.backend.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def token_strings(self, ids) -> list[str]:
        """One readable string per id (for plot labels): its decoded text, or the raw token when
        that is empty or a partial UTF-8 character."""
        out = []
        for i in self._check(ids):
            text = self.backend.decode([i], skip_special_tokens=False)
            if not text or "\ufffd" in text:
                raw = self.backend.convert_ids_to_tokens(i) if self._hf else self.backend.id_to_token(i)
                text = raw if raw is not None else text
            out.append(text)
        return out

    def _check(self, ids) -> list[int]:
        try:  # ints, numpy ints and integer tensors; never a float silently truncated
            ids = [operator.index(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
        except TypeError:
            raise TypeError(f"token ids must be a sequence of ints, got {ids!r:.80}") from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}")
        return ids

    def __repr__(self) -> str:
        return f"Tokenizer({type(self.backend).__name__}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def find_tokenizer(path: str | os.PathLike, *, special: Special | None = None) -> Tokenizer | None:
    """The tokenizer saved in a checkpoint directory (offline), or None when it has none.

    Read with ``transformers.AutoTokenizer`` (honouring tokenizer_config.json) when installed,
    else from tokenizer.json with ``tokenizers``. ``special``: an encoder-decoder's decoding tokens.
    """
    d = Path(path)
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        return None
    eos = read_config(d).get("eos_token_id") if (d / "config.json").is_file() else None
    eos = eos[0] if isinstance(eos, list) and eos else eos
    eos = eos if isinstance(eos, int) else None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        if not (d / "tokenizer.json").is_file():
            raise ValueError(f"the tokenizer in {d} needs transformers: pip install 'qkv[hf]'") from None
        from tokenizers import Tokenizer as Fast

        return Tokenizer(Fast.from_file(str(d / "tokenizer.json")), eos_id=eos, special=special)
    try:
        backend = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except ImportError as e:  # MarianTokenizer needs sentencepiece
        raise ValueError(f"cannot load the tokenizer in {d}: {e}; pip install 'qkv[hf]'") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot load the tokenizer in {d}: {e}") from None
    return Tokenizer(backend, eos_id=eos, special=special)


def load_tokenizer(path: str | os.PathLike, *, special: Special | None = None) -> Tokenizer | None:
    """Deprecated name of ``find_tokenizer`` (None when the directory has no tokenizer), kept for one
    release: ``qkv.data.load_tokenizer`` is the loader that raises when a run has none."""
    warnings.warn("qkv.interop.hf.load_tokenizer is now find_tokenizer", DeprecationWarning, stacklevel=2)
    return find_tokenizer(path, special=special)
