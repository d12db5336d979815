"""Data: corpora, tokenizers, gettext catalogs (translation pairs) and per-token labels.

    corpus.py       the embedded default corpus and user text, split by file
    tokenizers.py   character and byte-level BPE tokenizers, fitted and cached
    catalogs.py     English → other-language pairs from the system's gettext catalogs
    tokens.py       text → ids and one readable label per token (for figures and the explorer)
"""
from .corpus import VAL_FRACTION, Corpus, default_corpus, load_corpus, read_text, split_by_file, stdlib_files
from .tokenizers import (
    SPECIAL_TOKENS, TOKENIZER_FILE, BPETokenizer, CharTokenizer, encode_corpus, fit_tokenizer, load_tokenizer,
    tokenizer_from_json, train_tokenizer,
)

__all__ = ["Corpus", "VAL_FRACTION", "default_corpus", "load_corpus", "read_text", "split_by_file", "stdlib_files",
           "CharTokenizer", "BPETokenizer", "SPECIAL_TOKENS", "TOKENIZER_FILE", "encode_corpus", "fit_tokenizer",
           "load_tokenizer", "tokenizer_from_json", "train_tokenizer"]
