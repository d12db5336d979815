"""A qkv run as a Hugging Face directory that ``transformers`` loads with no qkv installed.

    weights    ``to_hf``: learned PE + LayerNorm → GPT2LMHeadModel, RoPE + RMSNorm + a gated feed-forward →
               LlamaForCausalLM, RoPE + LayerNorm → GPTNeoXForCausalLM; a model of an open family's shape
               (Qwen2, Qwen3, Mistral, Gemma 2: biases, QK-norm, sliding windows, soft caps) as that family
               (a LoRA run's adapters are merged first); anything else is refused naming each field without
               a counterpart
    tokenizer  byte-level BPE as it is (a ``tokenizers`` Tokenizer); a character vocabulary as a
               WordLevel model over single characters (same ids, same text back); a chat run's template
               (chat_template.jinja) as the tokenizer's chat template, ChatML's end of turn as its eos

Written into a temporary sibling directory, then renamed: a failure leaves nothing behind.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .run_dir import RunDir
from ..data import BPETokenizer, CharTokenizer
from ..fileio import atomic_dir, check_free_dir
from ..models import GPT
from ..interop.hf import to_hf


def char_tokenizer(tokenizer: CharTokenizer):
    """qkv's character vocabulary as a ``tokenizers`` Tokenizer: every character is one word of a
    WordLevel model with qkv's ids, and decoding joins them with nothing between."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(tokenizer.chars)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")  # (?m): "." matches "\n" too
    tok.decoder = decoders.Fuse()
    return tok


def hf_tokenizer(tokenizer: BPETokenizer | CharTokenizer):
    """A ``transformers.PreTrainedTokenizerFast`` that encodes and decodes as ``tokenizer`` does."""
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, BPETokenizer):
        backend = tokenizer.tokenizer
    elif isinstance(tokenizer, CharTokenizer):
        backend = char_tokenizer(tokenizer)
    else:
        raise ValueError(f"no Hugging Face tokenizer for a {type(tokenizer).__name__}")
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def run_tokenizer(run: str | os.PathLike, tokenizer: BPETokenizer | CharTokenizer):
    """``hf_tokenizer`` with the run's chat template (chat_template.jinja, written by a --task sft | dpo
    run) as its own, and ChatML's end of turn as its eos where the vocabulary has it."""
    hf_tok = hf_tokenizer(tokenizer)
    template = Path(run) / "chat_template.jinja"
    if template.is_file():
        from ..data.chat_template import CHATML_TOKENS

        hf_tok.chat_template = template.read_text(encoding="utf-8")
        if hf_tok.convert_tokens_to_ids(CHATML_TOKENS[1]) not in (None, hf_tok.unk_token_id):
            hf_tok.eos_token = CHATML_TOKENS[1]  # where a ChatML reply ends
    return hf_tok


def load_decoder(run: str | os.PathLike):
    """The run's model and tokenizer; ValueError for a run that is not a decoder-only language model."""
    loaded = RunDir(run).load()
    if not isinstance(loaded.model, GPT):
        raise ValueError(f"{run} holds a {type(loaded.model).__name__}; qkv export writes decoder-only "
                         "language models (GPT-2, LLaMA, GPT-NeoX, Qwen2, Qwen3, Mistral, Gemma 2 …)")
    return loaded


def export_run(run: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
               overwrite: bool = False) -> Path:
    """Write run ``run``'s model (its weights in ``dtype``) and tokenizer to ``out`` as ``save_pretrained`` would.

    ``out`` must be missing or empty unless ``overwrite``. Raises ValueError, with nothing written,
    for a run that is not a decoder, or whose model or tokenizer has no Hugging Face counterpart.
    """
    out = check_free_dir(out, overwrite=overwrite)
    loaded = load_decoder(run)
    hf_model, hf_tok = to_hf(loaded.model.to(dtype)), run_tokenizer(run, loaded.tokenizer)

    def write(tmp: Path) -> None:
        hf_model.save_pretrained(tmp)  # safetensors
        hf_tok.save_pretrained(tmp)

    return atomic_dir(out, write, overwrite=overwrite)


def export_run_gguf(run: str | os.PathLike, out: str | os.PathLike, *, gguf_type: str = "f16",
                    dtype: torch.dtype = torch.float32, overwrite: bool = False) -> Path:
    """Write run ``run`` as the GGUF file ``out`` (``qkv.interop.gguf.to_gguf``: the families of its
    ``ARCHES``; matrices of ``gguf_type``, from the weights in ``dtype``). ValueError, with nothing written, for
    what llama.cpp cannot run."""
    from ..interop.gguf import to_gguf

    loaded = load_decoder(run)
    return to_gguf(loaded.model.to(dtype), run_tokenizer(run, loaded.tokenizer), out, dtype=gguf_type,
                   overwrite=overwrite, name=Path(run).resolve().name)
