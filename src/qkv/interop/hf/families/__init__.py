"""The Hugging Face families qkv reads and writes, one module each, registered in ``FAMILIES`` by model_type.

A family module holds what is particular to it — its HF config -> ModelConfig mapping, its weight
rule table, its export config, its ignored keys, its HF class names — and ends with ``FAMILY``, a
``Family``. Adding one is writing that module and adding it to ``BUILT_IN`` (or, from outside qkv,
calling ``register_family``); neither the loader nor the exporter changes.
"""
from __future__ import annotations

from ..family import Family
from . import (bert, deepseek, gemma2, gemma3, gpt2, gpt_neox, gpt_oss, llama, marian, mistral, mixtral, olmo2, phi3,
               qwen2, qwen2_moe, qwen3, qwen3_moe, smollm3)

BUILT_IN = (gpt2.FAMILY, llama.FAMILY, gpt_neox.FAMILY, bert.FAMILY, marian.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
            mistral.FAMILY, gemma2.FAMILY, gemma3.FAMILY, gemma3.MULTIMODAL,
            deepseek.V3, deepseek.V2, smollm3.FAMILY, olmo2.FAMILY, phi3.FAMILY, mixtral.FAMILY, qwen2_moe.FAMILY,
            qwen3_moe.FAMILY, gpt_oss.FAMILY)
FAMILIES: dict[str, Family] = {f.model_type: f for f in BUILT_IN}


def register_family(family: Family, *, replace: bool = False) -> None:
    """Make ``from_hf`` load checkpoints of ``family.model_type`` (and ``to_hf`` write them, if it exports)."""
    if not isinstance(family, Family):
        raise TypeError(f"register_family takes a qkv.interop.hf.Family, got {type(family).__name__}")
    if family.model_type in FAMILIES and not replace:
        raise ValueError(f"model_type {family.model_type!r} is already registered (pass replace=True to replace it)")
    FAMILIES[family.model_type] = family

