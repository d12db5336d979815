"""Models built from the blocks: a decoder-only LM (GPT), a bidirectional Encoder, and the paper's
encoder-decoder Transformer; their configuration (``ModelConfig``, in component sections) and the factory
that builds each block's parts from it.

    config.py           ModelConfig and its sections, PRESETS
    attention_config.py its attention section: AttentionConfig (multi-head) or LatentAttentionConfig (latent)
    sections.py         the position, feed-forward, norm, embedding and head sections; moe_config.py, the experts'
    components.py       the factory: position, attention (a registry of kinds), feed-forward, blocks
    trunk.py            embeddings → blocks → final norm, shared by the three models
    gpt.py, encoder.py, encoder_decoder.py, pointer.py (the encoder-decoder with a copy mechanism)
    decoders.py         where the generate methods find their decoder (registered by qkv/__init__.py)
"""
from .config import (
    LAYER_TYPES, POSITIONAL, PRESETS, AttentionConfig, EmbeddingConfig, FeedForwardConfig, HeadConfig, ModelConfig,
    NormConfig, PositionConfig,
)
from .attention_config import LatentAttentionConfig
from .encoder import Encoder
from .encoder_decoder import Transformer
from .gpt import GPT
from .trunk import ModelOutput, token_cross_entropy

__all__ = [
    "ModelConfig", "AttentionConfig", "LatentAttentionConfig", "PositionConfig", "FeedForwardConfig", "NormConfig", "EmbeddingConfig",
    "HeadConfig", "PRESETS", "POSITIONAL", "LAYER_TYPES", "GPT", "Encoder", "Transformer", "ModelOutput",
    "token_cross_entropy",
]
