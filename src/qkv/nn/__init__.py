"""The reference layer: the spec's modules, written to be read beside the paper, in plain PyTorch.

    attention.py          scaled_dot_product_attention (the formula, beside PyTorch's fused call), SelfAttention,
                          MultiHeadAttention (grouped K/V heads, cross-attention, a KV cache)
    masks.py              the one mask convention (bool True = may attend), causal and padding masks
    positional.py         sinusoidal, learned, rotary (RoPE) and ALiBi positions
    relative_bias.py      T5's bucketed relative position bias (a learned per-head bias on the scores)
    layers.py             the feed-forward (the activations' one table) and the norms
    block.py              the Transformer block, pre- or post-norm, with cross-attention for a decoder
    kv_cache.py           a preallocated key/value cache for one attention layer
    latent_attention.py   multi-head latent attention (DeepSeek-V2/V3), its latent and naive decode caches
    flash.py, linear_attention.py   FAQ Q4's answers to O(n²), as readable references

Nothing here imports another qkv layer: the speed layer (``qkv.kernels``) is applied on top of a model.
"""
from .attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from .block import TransformerBlock
from .flash import flash_attention
from .kv_cache import KVCache
from .latent_attention import DecompressedKVCache, LatentCache, MultiHeadLatentAttention
from .layers import ACTIVATIONS, FeedForward
from .linear_attention import linear_attention, linear_attention_quadratic
from .masks import causal_mask, causal_mask_at, padding_mask
from .positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .relative_bias import T5RelativePositionBias, relative_position_bucket

__all__ = ["scaled_dot_product_attention", "SelfAttention", "MultiHeadAttention", "TransformerBlock", "KVCache",
           "MultiHeadLatentAttention", "LatentCache", "DecompressedKVCache",
           "FeedForward", "ACTIVATIONS", "flash_attention", "linear_attention", "linear_attention_quadratic",
           "causal_mask", "causal_mask_at", "padding_mask", "SinusoidalPositionalEncoding",
           "LearnedPositionalEmbedding", "RotaryEmbedding", "ALiBi", "T5RelativePositionBias",
           "relative_position_bucket"]
