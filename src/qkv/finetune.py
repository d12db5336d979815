"""Fine-tuning a real checkpoint: the base a run starts from, and its identity.

    base      a Hugging Face GPT-2 or LLaMA-family directory: weights through ``from_hf``, its own
              tokenizer kept unchanged (byte-level BPE, stored in the run as tokenizer.json)
    identity  the SHA-256 of its weight files, recorded in train_config.json: ``--resume`` (and a
              LoRA run, which stores only its adapters) refuses any other base
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .data import BPETokenizer, tokenizer_from_json
from .models import GPT


@dataclass
class Base:
    """A checkpoint to fine-tune: model (qkv.GPT), the run's tokenizer, and the weights' SHA-256."""

    model: GPT
    tokenizer: BPETokenizer
    sha256: str
    path: str


def weights_sha256(path: str | os.PathLike) -> str:
    """SHA-256 over a checkpoint directory's ``*.safetensors`` files (by name, then content)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no .safetensors weights")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def run_tokenizer(tokenizer, where: str) -> BPETokenizer:
    """A checkpoint's tokenizer (``qkv.interop.hf.Tokenizer``) as a qkv BPETokenizer, which a run
    saves as tokenizer.json; ValueError for one that is not BPE (WordPiece, Unigram …)."""
    backend = tokenizer.backend
    fast = getattr(backend, "backend_tokenizer", backend)  # transformers' fast tokenizer, or tokenizers' own
    if not hasattr(fast, "to_str"):
        raise ValueError(f"the tokenizer in {where} has no fast (tokenizer.json) form; a run keeps BPE tokenizers")
    text = fast.to_str()
    kind = json.loads(text).get("model", {}).get("type")
    if kind != "BPE":
        raise ValueError(f"the tokenizer in {where} is {kind}; a run keeps BPE tokenizers (GPT-2's, LLaMA's)")
    return tokenizer_from_json(text)


def load_base(path: str | os.PathLike, *, expect_sha256: str | None = None) -> Base:
    """The checkpoint at ``path`` to fine-tune; ValueError for anything but a decoder with a matching
    BPE tokenizer, or for weights whose SHA-256 is not ``expect_sha256`` (when given)."""
    from .interop.hf import load_pretrained

    where = str(path)
    if not Path(path).is_dir():
        raise ValueError(f"--init-from-hf {where}: no such directory")
    model, tokenizer = load_pretrained(path)
    if not isinstance(model, GPT):
        raise ValueError(f"--init-from-hf {where} is not a decoder (it loads as qkv.{type(model).__name__}); "
                         "fine-tuning starts from a decoder-only checkpoint (GPT-2 or LLaMA family)")
    if tokenizer is None:
        raise ValueError(f"--init-from-hf {where} has no tokenizer files (tokenizer.json …): a run needs its tokenizer")
    sha = weights_sha256(path)
    if expect_sha256 is not None and sha != expect_sha256:
        raise ValueError(f"--init-from-hf {where} is not the base this run was trained from: its weights' SHA-256 "
                         f"is {sha[:16]}…, the run's base had {expect_sha256[:16]}…")
    return Base(model=model, tokenizer=run_tokenizer(tokenizer, where), sha256=sha, path=where)
