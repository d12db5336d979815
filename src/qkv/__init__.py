"""qkv: the Transformer's core — attention, multi-head attention, positional encodings — readable and tested.

The names here are the reference layer (``qkv.nn``, ``qkv.models``), which imports nothing of the speed
layer (``qkv.kernels``) nor of decoding (``qkv.generation``); ``qkv.interop`` and the rest load when first used.
This root, which Python runs before any ``qkv.*`` module, registers the models' ``generate`` methods' decoders
(``qkv.models.decoders``), each imported from ``qkv.generation.methods`` on its first call.
"""
from importlib import import_module
from typing import Callable

from .models import GPT, PRESETS, Encoder, ModelConfig, ModelOutput, Transformer
from .models.decoders import register_decoder
from .nn.attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from .nn.block import TransformerBlock
from .nn.flash import flash_attention
from .nn.kv_cache import KVCache
from .nn.latent_attention import MultiHeadLatentAttention
from .nn.layers import FeedForward
from .nn.linear_attention import linear_attention, linear_attention_quadratic
from .nn.masks import causal_mask, padding_mask
from .nn.positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .nn.relative_bias import T5RelativePositionBias

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "causal_mask", "padding_mask",
    "flash_attention", "linear_attention", "linear_attention_quadratic",
    "SelfAttention", "MultiHeadAttention", "MultiHeadLatentAttention",
    "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding", "ALiBi",
    "T5RelativePositionBias", "FeedForward", "TransformerBlock", "KVCache",
    "ModelConfig", "ModelOutput", "PRESETS", "GPT", "Encoder", "Transformer", "interop",
]


def lazy_decoder(name: str) -> Callable:
    """``qkv.generation.methods.<name>``, imported when first called, so that ``import qkv`` loads no decoding."""
    def decoder(*args, **kwargs):
        from .generation import methods

        return getattr(methods, name)(*args, **kwargs)

    decoder.__name__ = decoder.__qualname__ = name
    return decoder


register_decoder("GPT.generate", lazy_decoder("gpt_generate"))
register_decoder("Transformer.generate", lazy_decoder("transformer_generate"))
LAZY = ("interop", "generation", "kernels", "training", "data", "viz", "claims", "studies")


def __getattr__(name: str):
    """``qkv.interop`` (and the other packages) imported on first use, so ``import qkv`` stays the reference."""
    if name in LAZY:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")
