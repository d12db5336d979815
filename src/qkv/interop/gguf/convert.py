"""Conversion without training, through qkv's model: a Hugging Face directory as a GGUF file (what llama.cpp's
``convert_hf_to_gguf.py`` does: ``from_hf`` then ``to_gguf``) and a GGUF file as a Hugging Face directory
(``from_gguf`` then ``to_hf``). Each writes atomically: a failure leaves nothing behind."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ...fileio import atomic_dir, check_free_dir
from ..hf import load_pretrained, to_hf
from .reader import load_gguf


def hf_to_gguf(directory: str | os.PathLike, out: str | os.PathLike, *, gguf_type: str = "f16",
               dtype: torch.dtype | str = torch.float32, overwrite: bool = False) -> Path:
    """Write the Hugging Face checkpoint ``directory`` (with its tokenizer) as the GGUF file ``out``, its matrices
    of ``gguf_type`` (``to_gguf``'s ``dtype``), the weights read in ``dtype`` first. ValueError, with nothing
    written, for a directory without a tokenizer or a model llama.cpp cannot run as it is."""
    from . import to_gguf

    model, tokenizer = load_pretrained(directory, dtype=dtype)
    if tokenizer is None:
        raise ValueError(f"{directory} has no tokenizer files (tokenizer.json …): a GGUF file carries its tokenizer")
    return to_gguf(model, tokenizer.backend, out, dtype=gguf_type, overwrite=overwrite,
                   name=Path(directory).resolve().name)


def gguf_to_hf(path: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32,
               overwrite: bool = False) -> Path:
    """Write the GGUF file ``path`` as the Hugging Face directory ``out`` (missing or empty unless ``overwrite``):
    the model dequantised, in ``dtype``, its tokenizer, chat template and bos/eos ids, as ``save_pretrained``
    writes them."""
    out = check_free_dir(out, overwrite=overwrite)
    model, tokenizer = load_gguf(path, dtype=dtype)
    hf_model = to_hf(model)

    def write(tmp: Path) -> None:
        hf_model.save_pretrained(tmp)  # safetensors
        tokenizer.backend.save_pretrained(tmp)

    return atomic_dir(out, write, overwrite=overwrite)
