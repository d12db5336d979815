"""The models' ``generate`` methods, as functions of the model: ``GPT.generate`` and ``Transformer.generate``.

The reference layer (``qkv.models``) imports no decoding; its methods call these through the registry of
``qkv.models.decoders``, which ``qkv/__init__.py`` fills. Shapes: B batch, T prompt length, S source length.
"""
from __future__ import annotations

from torch import Tensor

from .beam_search import Special, decode, search_settings
from .config import config_defaults
from .decode import generate


def gpt_generate(model, ids: Tensor, max_new_tokens: int | None = None, **kwargs) -> Tensor:
    """``GPT.generate``: ids (B, T) -> (B, T + n) by ``qkv.generation.generate``.

    Every argument not given comes from ``model.generation_config`` when it has one (a checkpoint's, attached
    by ``qkv.interop.from_hf``), as Hugging Face's ``generate`` would use it (``config_defaults``).
    """
    if model.generation_config is not None:
        max_new_tokens, kwargs = config_defaults(model.generation_config, ids, max_new_tokens, kwargs)
    if max_new_tokens is None:
        raise ValueError("generate needs max_new_tokens (the model has no generation_config to take it from)")
    return generate(model, ids, max_new_tokens, **kwargs)


def transformer_generate(model, src_ids: Tensor, *, src_mask: Tensor | None = None,
                         max_new_tokens: int | None = None, num_beams: int | None = None,
                         length_penalty: float | None = None, early_stopping: bool | None = None,
                         use_cache: bool = True, special: Special | None = None) -> Tensor:
    """``Transformer.generate``: sources (B, S) -> target ids (B, 1 + n), greedy or beam search (``decode``).

    An argument left None comes from ``model.generation_config`` (``search_settings``).
    """
    settings = search_settings(getattr(model, "generation_config", None), special=special,
                               max_new_tokens=max_new_tokens, num_beams=num_beams,
                               length_penalty=length_penalty, early_stopping=early_stopping)
    return decode(model, src_ids, src_mask=src_mask, use_cache=use_cache, **settings)
