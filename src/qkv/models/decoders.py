"""Where a model's ``generate`` finds its decoder: the reference layer defines the models and imports no decoding.

Decoding takes a model (``qkv.generation``), so a model cannot import decoding without a circle. Instead each
``generate`` method looks up the function registered under its name (``"GPT.generate"``), and the package root,
``qkv/__init__.py`` — which Python runs before any ``qkv.models`` module — registers
``qkv.generation.methods``'s functions, imported when first called (``import qkv`` loads no decoding).
"""
from __future__ import annotations

from typing import Callable

DECODERS: dict[str, Callable] = {}  # method name -> the function that runs it, called as fn(model, ...)


def register_decoder(method: str, decoder: Callable) -> None:
    """Make ``method`` (e.g. ``"GPT.generate"``) call ``decoder(model, *args, **kwargs)``."""
    if not callable(decoder):
        raise TypeError(f"a decoder must be callable, got {type(decoder).__name__} for {method!r}")
    DECODERS[method] = decoder


def decoder_for(method: str) -> Callable:
    """The function registered for ``method``; a clear error when nothing is."""
    if method not in DECODERS:
        raise LookupError(f"no decoder registered for {method!r} (registered: {sorted(DECODERS)}); "
                          "qkv/__init__.py registers qkv.generation.methods' functions when qkv is imported")
    return DECODERS[method]
