"""What every study's ``run`` does before its first model: the language checked, the output folder checked
(before any training), the CPU threads fixed for the whole study; and the character-level text most studies
train on.

Shapes: N_val validation characters.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, TypeVar

from ..data import load_corpus, train_tokenizer
from ..runtime import fixed_threads, prepare_output_dir
from ..viz.text import language

Result = TypeVar("Result")


def run_study(body: Callable[..., Result], cfg, outputs: tuple[str, ...], *, out: str | os.PathLike | None,
              overwrite: bool, lang: str, **inputs) -> Result:
    """``body(cfg, out, lang=lang, **inputs)`` once ``lang`` and ``out`` are checked (``outputs``, the study's
    files, before any training: ``overwrite=False`` refuses a folder that has them) and with ``cfg.threads``
    fixed for the whole study (None: the cores other processes leave free; the count run is ``cfg``'s)."""
    lang = language(lang)
    out = prepare_output_dir(out, outputs, overwrite=overwrite, what="a study's results")
    with fixed_threads(cfg.threads) as n:
        return body(replace(cfg, threads=n), out, lang=lang, **inputs)


def char_text(corpus, data):
    """(corpus, tokenizer, val_ids): ``corpus`` or ``load_corpus(data)``, a character tokenizer of all its text
    (one character = one token) and its validation text encoded (N_val,)."""
    corpus = corpus if corpus is not None else load_corpus(data)
    tokenizer = train_tokenizer("char", corpus.train + corpus.val)
    return corpus, tokenizer, tokenizer.encode_tensor(corpus.val)
