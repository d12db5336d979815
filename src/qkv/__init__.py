"""qkv: the Transformer's core — attention, multi-head attention, positional encodings — readable and tested."""
from .attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from .block import TransformerBlock
from .kv_cache import KVCache
from .layers import FeedForward
from .masks import causal_mask, padding_mask
from .models import GPT, PRESETS, Encoder, ModelConfig, ModelOutput, Transformer
from .positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from . import interop  # noqa: E402  (qkv.interop.from_hf etc.; imports only torch until used)

__version__ = "0.1.0"
__all__ = [
    "scaled_dot_product_attention", "causal_mask", "padding_mask",
    "SelfAttention", "MultiHeadAttention",
    "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding", "ALiBi",
    "FeedForward", "TransformerBlock", "KVCache",
    "ModelConfig", "ModelOutput", "PRESETS", "GPT", "Encoder", "Transformer", "interop",
]
