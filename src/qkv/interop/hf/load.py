"""``from_hf``: a Hugging Face checkpoint as a qkv model, or one ValueError listing every problem with it.

The family's config mapping gives a ``ModelConfig``; a skeleton of the qkv model on the meta device
gives every shape the rule table must produce. Unsupported settings, missing and unexpected keys,
wrong shapes and tied copies that differ are all collected first, before any weight is allocated, and
reported together: a half-loaded model is never returned.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from ...generation.config import GenerationConfig
from ...models import GPT, Encoder, ModelConfig, Transformer
from ...runtime import resolve_dtype
from .families import FAMILIES
from .family import Family
from .files import generation_settings, read_config, read_safetensors
from .tokenizer import Tokenizer, find_tokenizer


def listing(label: str, items: list[str], most: int = 6) -> str:
    """``3 missing keys: a, b, c``, cut after ``most``."""
    shown = ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")
    return f"{len(items)} {label}: {shown}"


def fail(name: str, model_type: str, problems: list[str]) -> ValueError:
    """All problems in one line (the command prints the first line of an error)."""
    return ValueError(f"cannot load {name} as {model_type}: " + "; ".join(problems))


def family_for(hf_config: dict, name: str) -> Family:
    """The registered family of the config's model_type."""
    model_type = hf_config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"cannot load {name}: model_type {model_type!r} is not supported "
                         f"(qkv loads {', '.join(sorted(FAMILIES))})")
    return FAMILIES[model_type]


def differing_copies(tensors: dict[str, Tensor], copies: dict[str, str]) -> list[str]:
    """Tied keys present in the checkpoint must hold exactly the tensor they are tied to."""
    return [f"{key} differs from the token embedding {src} although the checkpoint ties them"
            for key, src in copies.items() if key in tensors and src in tensors
            and (tensors[key].shape != tensors[src].shape or not torch.equal(tensors[key], tensors[src]))]


def match(tensors: dict[str, Tensor], family: Family, config: ModelConfig, skeleton: dict[str, Tensor],
          problems: list[str]) -> dict[str, Tensor]:
    """HF tensors -> qkv state dict; every missing/unexpected key and shape mismatch goes to problems."""
    tensors = family.merge({family.rename(k): t for k, t in tensors.items()}, config, problems)
    prefix = family.base + "." if any(k.startswith(family.base + ".") for k in tensors) else ""
    rules = {family.full_key(r.hf, prefix): r for r in family.rules(config)}
    copies = {family.full_key(k, prefix): family.full_key(src, prefix) for k, src in family.copies(config).items()}
    for key, src in copies.items():  # a file may keep any one of the tied names
        if src not in tensors and key in tensors:
            tensors[src] = tensors[key]
    missing = [k for k in rules if k not in tensors]
    unexpected = [k for k in tensors if k not in rules and k not in copies and not family.ignored.fullmatch(k)]
    wrong, out = [], {}
    for key, rule in rules.items():
        if key not in tensors:
            continue
        t, want = tensors[key], tuple(rule.to_hf(tuple(skeleton[q] for q in rule.qkv)).shape)
        if tuple(t.shape) != want or not t.is_floating_point():
            wrong.append(f"{key} {t.dtype} {tuple(t.shape)} (expected floating {want})")
            continue
        out.update(zip(rule.qkv, rule.to_qkv(t)))
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong)):
        if items:
            problems.append(listing(label, items))
    problems += differing_copies(tensors, copies)
    return out


def build(hf_config: dict, load: Callable[[], dict[str, Tensor]], name: str, *,
          dtype: torch.dtype, dropout: float) -> GPT | Encoder | Transformer:
    """The qkv model of a config and its tensors (``load`` is called only once the config passes)."""
    family, problems = family_for(hf_config, name), []
    fields = family.config(hf_config, problems)
    try:
        config = ModelConfig.from_dict({**fields, "dropout": dropout})
    except (ValueError, TypeError) as e:
        problems.append(str(e))
    if problems:
        raise fail(name, family.model_type, problems)
    with torch.device("meta"):  # shapes only: nothing is allocated before the checkpoint passes
        skeleton = family.model(config).state_dict()
    state = match(load(), family, config, skeleton, problems)
    if problems:
        raise fail(name, family.model_type, problems)
    model = family.model(config)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def attach_generation_config(model: nn.Module, settings: dict, name: str) -> nn.Module:
    """Set ``model.generation_config`` from a checkpoint's generation settings (not on an ``Encoder``: it
    generates nothing), with one warning naming the settings qkv's generate does not apply."""
    if isinstance(model, (GPT, Transformer)):
        model.generation_config = GenerationConfig.from_hf(settings, model.config.vocab_size)
        if model.generation_config.ignored:
            warnings.warn(f"{name}: qkv's generate does not apply these generation settings: "
                          + "; ".join(model.generation_config.ignored), UserWarning, stacklevel=3)
    return model


def hf_generation_settings(source: nn.Module) -> dict:
    """An in-memory transformers model's config and generation config (its non-default keys), merged."""
    gen = getattr(source, "generation_config", None)
    diff = gen.to_diff_dict() if hasattr(gen, "to_diff_dict") else {}
    return {**source.config.to_dict(), **diff}


def from_hf(source: str | os.PathLike | nn.Module, *, dtype: torch.dtype | str = torch.float32,
            dropout: float = 0.0) -> GPT | Encoder | Transformer:
    """A qkv model with the weights of a Hugging Face checkpoint of a family in ``FAMILIES`` (GPT-2, LLaMA,
    Qwen2/3, Mistral, Gemma 2/3, DeepSeek-V2/V3, Mixtral, Qwen2/3-MoE, SmolLM3, OLMo 2, Phi-3, GPT-NeoX, BERT, Marian).

    Args:
        source: a directory written by ``save_pretrained`` (config.json + model.safetensors,
            possibly sharded; transformers 4.x or 5.x), or an in-memory ``transformers`` model.
        dtype: the returned model's dtype: a floating ``torch.dtype`` or "auto" | "float32" | "bfloat16" |
            "float16" (``qkv.runtime.resolve_dtype``: auto is bfloat16 where it is computed natively).
        dropout: qkv's one dropout rate (HF's several rates are training settings, not loaded).
    Returns:
        ``qkv.GPT`` (the decoders), ``qkv.Encoder`` (bert, without pooler or MLM head) or
        ``qkv.Transformer`` (marian: MarianMTModel), in eval mode. A GPT or Transformer carries the
        checkpoint's generation settings as ``model.generation_config`` (a ``qkv.generation.GenerationConfig``
        from generation_config.json over config.json): its ``generate`` defaults, as Hugging Face's.
    Raises:
        ValueError listing every problem at once: no config.json, unsupported model_type or
        setting, missing or unexpected keys, shape mismatches.
    """
    dtype = resolve_dtype(dtype)
    if isinstance(source, (str, os.PathLike)):
        d = Path(source)
        model = build(read_config(d), lambda: read_safetensors(d), str(d), dtype=dtype, dropout=dropout)
        return attach_generation_config(model, generation_settings(d), str(d))
    if isinstance(source, nn.Module) and hasattr(getattr(source, "config", None), "to_dict"):
        name = type(source).__name__
        model = build(source.config.to_dict(), source.state_dict, name, dtype=dtype, dropout=dropout)
        return attach_generation_config(model, hf_generation_settings(source), name)
    raise TypeError(f"from_hf expects a directory path or a transformers model, got {type(source).__name__}")


def load_pretrained(path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32
                    ) -> tuple[GPT | Encoder | Transformer, Tokenizer | None]:
    """``from_hf(path)`` and the tokenizer saved beside it (None when the directory has none).

    For an encoder-decoder (Marian) the tokenizer carries the family's ``special`` decoding tokens
    (``marian_special(path)``).
    """
    model = from_hf(path, dtype=dtype)
    family = family_for(read_config(Path(path)), str(path))
    tokenizer = find_tokenizer(path, special=family.special(Path(path)) if family.special else None)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")
    return model, tokenizer
