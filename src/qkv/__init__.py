"""qkv: the Transformer's core — attention, multi-head attention, positional encodings — readable and tested."""
from .attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from .block import TransformerBlock
from .flash import flash_attention
from .kv_cache import KVCache
from .layers import FeedForward
from .linear_attention import linear_attention, linear_attention_quadratic
from .masks import causal_mask, padding_mask
from .models import GPT, PRESETS, Encoder, ModelConfig, ModelOutput, Transformer
from .positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from . import interop  # noqa: E402  (qkv.interop.from_hf etc.; imports only torch until used)

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "causal_mask", "padding_mask",
    "flash_attention", "linear_attention", "linear_attention_quadratic",
    "SelfAttention", "MultiHeadAttention",
    "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding", "ALiBi",
    "FeedForward", "TransformerBlock", "KVCache",
    "ModelConfig", "ModelOutput", "PRESETS", "GPT", "Encoder", "Transformer", "interop",
]
