"""The factory: each block's parts built from a ``ModelConfig``, one builder per kind.

    position        added to the embeddings (sinusoidal, learned), or a module inside attention (rope, alibi,
                    t5) that every block of a stack shares (t5's learned table too, as T5: one-sided in causal
                    stacks, bidirectional in encoders)
    attention       ATTENTIONS[config.attention.kind](config, layer): a block's self-attention: mha
                    (MultiHeadAttention), mla (MultiHeadLatentAttention, from a LatentAttentionConfig; its RoPE
                    over qk_rope_head_dim) or sink (SinkAttention: a learned logit per head in the softmax's
                    denominator, gpt-oss)
    feed-forward    FeedForward(d_model, ff_width, activation); in the layers config.moe_layer(i) names a
                    MixtureOfExperts (qkv.nn.moe: router, SwiGLU experts, a shared expert) from config.moe
    block           TransformerBlock.from_parts(attention, feed-forward, norm, ...); with feed_forward.parallel
                    a ParallelTransformerBlock (both sublayers read the block's input); with normalization.sandwich
                    a SandwichTransformerBlock (a norm after each sublayer too: Gemma 2/3); with
                    normalization.post_sublayer a PostSublayerTransformerBlock (x + Norm(sublayer(x)): OLMo-2)
    layer types     a sliding_attention layer attends within attention.sliding_window (its mask is the trunk's)
                    and rotates with position.local_base where set (Gemma 3's local RoPE); a layer of
                    position.nope_layers has no RoPE at all (SmolLM3's NoPE layers)

A new attention class plugs in with ``register_attention(kind, builder)``: the block takes whatever
module the builder returns, so neither ``qkv.nn.block`` nor the models change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..nn.attention import MultiHeadAttention
from ..nn.block import (ParallelTransformerBlock, PostSublayerTransformerBlock, SandwichTransformerBlock,
                        TransformerBlock)
from ..nn.latent_attention import MultiHeadLatentAttention, latent_softmax_scale
from ..nn.layers import FeedForward, ProjectionRMSNorm, make_norm
from ..nn.moe import MixtureOfExperts, Router, SwiGLUExperts
from ..nn.positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from ..nn.relative_bias import T5RelativePositionBias
from ..nn.sink_attention import SinkAttention
from .config import ModelConfig


@dataclass(frozen=True)
class Layer:
    """What a builder knows of the layer it builds for."""

    index: int
    type: str  # one of qkv.models.config.LAYER_TYPES
    rope: nn.Module | None = None  # position inside attention, shared by the blocks
    alibi: nn.Module | None = None
    relative_bias: nn.Module | None = None  # T5's bucketed bias, shared by the blocks


def multi_head(config: ModelConfig, layer: Layer, kind: type = MultiHeadAttention) -> MultiHeadAttention:
    """The spec's multi-head attention (grouped K/V heads, a head width and a bias per projection), with
    QK-norm (the model's norm kind over each head's D), the scores' scale and soft cap where configured;
    ``kind`` a subclass taking the same arguments (SinkAttention)."""
    a, n = config.attention, config.normalization
    q_norm, k_norm = qk_norms(config) if a.qk_norm else (None, None)
    return kind(config.d_model, a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim,
                              bias=a.biases, dropout=config.dropout, rope=layer.rope, alibi=layer.alibi,
                              relative_bias=layer.relative_bias, q_norm=q_norm, k_norm=k_norm, softcap=a.softcap,
                              scale=None if a.query_scalar is None else a.query_scalar ** -0.5)


def qk_norms(config: ModelConfig) -> tuple[nn.Module, nn.Module]:
    """QK-norm's two norms: the model's norm kind over each head's D, or (qk_norm_scope "projection", OLMo-2) an
    RMSNorm over all of q's H·D and all of k's G·D."""
    n, D = config.normalization, config.head_dim
    if config.attention.qk_norm_scope == "projection":
        return ProjectionRMSNorm(config.attention.num_heads, D, n.eps), ProjectionRMSNorm(config.kv_heads, D, n.eps)
    return make_norm(n.kind, D, n.eps), make_norm(n.kind, D, n.eps)


def latent_attention(config: ModelConfig, layer: Layer) -> MultiHeadLatentAttention:
    """DeepSeek's multi-head latent attention (``qkv.nn.latent_attention``): its widths from the attention
    section, one bias for q_a/kv_a/o (the section's, which agree), the scores' scale query_scalar^-½ where set
    (× YaRN's mscale², ``latent_softmax_scale``), the shared RoPE over qk_rope_head_dim dims
    (``attention_position``)."""
    a = config.attention
    scale = latent_softmax_scale(a.qk_nope_head_dim + a.qk_rope_head_dim, config.position.scaling,
                                 base=None if a.query_scalar is None else a.query_scalar ** -0.5)
    return MultiHeadLatentAttention(
        config.d_model, a.num_heads, kv_lora_rank=a.kv_lora_rank, qk_rope_head_dim=a.qk_rope_head_dim,
        qk_nope_head_dim=a.qk_nope_head_dim, v_head_dim=a.v_head_dim, q_lora_rank=a.q_lora_rank,
        softmax_scale=scale, bias=a.out_bias, dropout=config.dropout, rope=layer.rope)


def sink_heads(config: ModelConfig, layer: Layer) -> SinkAttention:
    """Multi-head attention with a learned sink logit per head in each softmax's denominator (gpt-oss)."""
    return multi_head(config, layer, SinkAttention)


AttentionBuilder = Callable[[ModelConfig, Layer], nn.Module]
ATTENTIONS: dict[str, AttentionBuilder] = {"mha": multi_head, "mla": latent_attention, "sink": sink_heads}


def register_attention(kind: str, builder: AttentionBuilder) -> None:
    """Make ``attention.kind = kind`` build ``builder(config, layer)``: a module called as MultiHeadAttention is."""
    if not isinstance(kind, str) or not kind or not callable(builder):
        raise TypeError(f"register_attention takes a kind (a non-empty str) and a builder, got {kind!r}, {builder!r}")
    ATTENTIONS[kind] = builder


def build_attention(config: ModelConfig, layer: Layer) -> nn.Module:
    kind = config.attention.kind
    if kind not in ATTENTIONS:
        raise ValueError(f"attention.kind {kind!r} is not registered; known kinds: {sorted(ATTENTIONS)} "
                         "(qkv.models.components.register_attention adds one)")
    return ATTENTIONS[kind](config, layer)


def embedding_position(config: ModelConfig) -> nn.Module | None:
    """The absolute position added to the token embeddings, or None (no PE, or PE inside attention)."""
    p = config.position
    if p.kind == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, p.base, layout=p.sinusoidal_layout)
    if p.kind == "learned":
        return LearnedPositionalEmbedding(config.max_len, config.d_model)
    return None


def attention_position(config: ModelConfig, *, causal: bool = False) -> dict[str, nn.Module | None]:
    """Position inside attention, one module the blocks share: RoPE rotates q and k (scaled as position.scaling
    says), ALiBi and T5's relative bias (one-sided where ``causal``, else bidirectional) bias the scores."""
    p = config.position
    head_dim = config.attention.qk_rope_head_dim if config.attention.kind == "mla" else config.head_dim
    rope = (RotaryEmbedding(head_dim, p.base, p.interleaved, rotary_dim=p.rotary_dim, scaling=p.scaling)
            if p.kind == "rope" else None)
    alibi = ALiBi(config.attention.num_heads) if p.kind == "alibi" else None
    t5 = (T5RelativePositionBias(config.attention.num_heads, bidirectional=not causal, num_buckets=p.num_buckets,
                                 max_distance=p.max_distance) if p.kind == "t5" else None)
    return dict(rope=rope, alibi=alibi, relative_bias=t5)


def norm_factory(config: ModelConfig) -> Callable[[], nn.Module]:
    n = config.normalization
    return lambda: make_norm(n.kind, config.d_model, n.eps)


def feed_forward(config: ModelConfig) -> FeedForward:
    f = config.feed_forward
    return FeedForward(config.d_model, config.ff_width, f.activation, bias=f.bias, dropout=config.dropout)


def mixture_of_experts(config: ModelConfig) -> MixtureOfExperts:
    """The MoE feed-forward of config.moe: its router, E SwiGLU experts of width moe.d_expert (else
    feed_forward.d_ff), a dense SwiGLU shared expert of moe.d_shared where set (with biases where moe.shared_bias;
    × σ(shared_gate(x)) where asked)."""
    m, C = config.moe, config.d_model
    router = Router(C, m.num_experts, m.top_k, score=m.score, top_k_first=m.top_k_first,
                    norm_topk_prob=m.norm_topk_prob, bias=m.router_bias, n_group=m.n_group, topk_group=m.topk_group,
                    correction_bias=m.has_correction_bias, scaling=m.routed_scaling_factor, group_score=m.group_score)
    experts = SwiGLUExperts(m.num_experts, C, m.d_expert or config.ff_width, bias=m.expert_bias,
                            activation=m.activation, limit=m.swiglu_limit, alpha=m.swiglu_alpha)
    shared = None if m.d_shared is None else FeedForward(C, m.d_shared, "swiglu", bias=m.shared_bias,
                                                         dropout=config.dropout)
    gate = nn.Linear(C, 1, bias=False) if m.shared_gate else None
    return MixtureOfExperts(router, experts, shared, gate)


def cross_attention(config: ModelConfig) -> MultiHeadAttention:
    """The encoder-decoder's cross-attention: multi-head, no position inside (the source's is in its memory)."""
    return multi_head(config, Layer(index=-1, type="cross_attention"))


def block(config: ModelConfig, layer: Layer, *, cross: bool = False) -> TransformerBlock:
    """One block: its self-attention, [cross-attention,] feed-forward (made in that order) and norms; a
    ParallelTransformerBlock where the feed-forward is parallel to attention."""
    attn = build_attention(config, layer)
    cross_attn = cross_attention(config) if cross else None
    kind = ParallelTransformerBlock if config.feed_forward.parallel else \
        SandwichTransformerBlock if config.normalization.sandwich else \
        PostSublayerTransformerBlock if config.normalization.post_sublayer else TransformerBlock
    ff = mixture_of_experts(config) if config.moe_layer(layer.index) else feed_forward(config)
    return kind.from_parts(attn, ff, norm_factory(config), norm_first=config.normalization.first,
                           cross_attn=cross_attn, dropout=config.dropout)


def local_rope(config: ModelConfig) -> RotaryEmbedding | None:
    """Sliding layers' own RoPE, plain with base position.local_base (Gemma 3's rope_local_base_freq: its
    local layers use default RoPE, whatever scaling the global ones have); None: they share the model's."""
    p = config.position
    if p.local_base is None:
        return None
    return RotaryEmbedding(config.head_dim, p.local_base, p.interleaved, rotary_dim=p.rotary_dim)


def blocks(config: ModelConfig, n: int, *, cross: bool = False, causal: bool = False) -> nn.ModuleList:
    """n blocks, each from the factory, sharing one RoPE, ALiBi or T5 bias module (sliding layers a RoPE
    of their own where position.local_base is set); ``causal``: a decoder's stack (T5's bias one-sided)."""
    inside, local = attention_position(config, causal=causal), local_rope(config)
    by_type = {"full_attention": inside, "sliding_attention": inside if local is None else {**inside, "rope": local}}
    nope = set(config.position.nope_layers or ())  # SmolLM3's NoPE layers: no position inside attention

    def position(i: int) -> dict[str, nn.Module | None]:
        shared = by_type[config.layer_type(i)]
        return {**shared, "rope": None} if i in nope else shared
    return nn.ModuleList(block(config, Layer(i, config.layer_type(i), **position(i)), cross=cross) for i in range(n))
