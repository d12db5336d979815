"""Models built from the blocks: a decoder-only LM (GPT), a bidirectional Encoder, and the
paper's encoder-decoder Transformer.

    x = Embed(ids) [+ PE(positions)] [+ TypeEmbed(types)] → [Norm] → N × Block → [Norm] → head

Shapes: B batch, T length, S source/key length, C model width, V vocabulary, H heads.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import TransformerBlock
from .kv_cache import KVCache
from .layers import ACTIVATIONS, GATED, NORMS, make_norm
from .masks import padding_mask
from .positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding

POSITIONAL = ("sinusoidal", "learned", "rope", "alibi", "none")
MAX_WIDTH = 1 << 16  # sanity bound on widths read from untrusted configs


@dataclass
class ModelConfig:
    """Everything that defines a model's shape. Validated on construction; see ``PRESETS``."""

    vocab_size: int = 256
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int | None = None  # None: 4 · d_model
    max_len: int = 256
    num_kv_heads: int | None = None  # None: num_heads (no grouping)
    positional: str = "learned"  # sinusoidal | learned | rope | alibi | none
    norm_first: bool = True  # pre-LN (GPT-2, LLaMA); False: the paper's post-LN
    activation: str = "gelu"
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    bias: bool = True  # biases in attention and feed-forward projections
    dropout: float = 0.0
    tie_embeddings: bool = True  # the LM head shares the token embedding matrix
    rope_base: float = 10000.0
    rope_interleaved: bool = False
    type_vocab_size: int = 0  # > 0: BERT's token-type (segment) embeddings
    embedding_norm: bool = False  # BERT normalises the summed embeddings
    scale_embeddings: bool = False  # token embeddings × √d_model before PE is added (Vaswani et al. §3.4)
    final_norm: bool | None = None  # None: same as norm_first
    num_decoder_layers: int | None = None  # encoder-decoder only; None: num_layers

    def __post_init__(self) -> None:
        ints = ("vocab_size", "d_model", "num_heads", "num_layers", "max_len")
        for name in ints + ("d_ff", "num_kv_heads", "num_decoder_layers"):
            value = getattr(self, name)
            if value is None and name not in ints:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
            if value > MAX_WIDTH * 64:
                raise ValueError(f"ModelConfig.{name}={value} is absurdly large (limit {MAX_WIDTH * 64})")
        if self.d_model > MAX_WIDTH:
            raise ValueError(f"ModelConfig.d_model={self.d_model} is absurdly large (limit {MAX_WIDTH})")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}, got {self.positional!r}")
        if self.activation not in ACTIVATIONS and self.activation not in GATED:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS) + sorted(GATED)}, got {self.activation!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got d_model/num_heads = {self.head_dim}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal PE needs an even d_model, got {self.d_model}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def has_final_norm(self) -> bool:
        return self.norm_first if self.final_norm is None else self.final_norm

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a dict (e.g. config.json), refusing unknown keys and wrong types."""
        if not isinstance(d, dict):
            raise TypeError(f"a model config must be a JSON object, got {type(d).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown ModelConfig keys: {unknown}")
        for k, v in d.items():
            default = getattr(cls, k, None)
            if isinstance(default, bool) and not isinstance(v, bool):
                raise TypeError(f"ModelConfig.{k} must be a bool, got {v!r}")
            if isinstance(default, str) and not isinstance(v, str):
                raise TypeError(f"ModelConfig.{k} must be a str, got {v!r}")
            if isinstance(default, float) and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"ModelConfig.{k} must be a number, got {v!r}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return replace(PRESETS[name], **overrides)


PRESETS: dict[str, ModelConfig] = {
    # Unit tests: a few thousand parameters.
    "tiny": ModelConfig(vocab_size=64, d_model=32, num_heads=4, num_layers=2, max_len=64),
    # `qkv train`'s default: 0.64 M parameters, trained for 3 minutes on 2 (busy) CPU cores with byte-level
    # BPE (2048 tokens; vocab_size comes from the tokenizer). Side by side in the same 3 minutes,
    # d_model 96 reached 1.77 bits per character where 128 reached 1.82; in another pair 192 reached
    # 2.11 where 128 reached 1.98 (README "Train and sample").
    "demo": ModelConfig(vocab_size=2048, d_model=96, num_heads=4, num_layers=4, max_len=128,
                        positional="rope", bias=False),
    # The paper's base model (Vaswani et al. Table 3): d=512, h=8, N=6, d_ff=2048, post-LN.
    "paper-base": ModelConfig(vocab_size=37000, d_model=512, num_heads=8, num_layers=6, d_ff=2048, max_len=512,
                              positional="sinusoidal", norm_first=False, activation="relu", scale_embeddings=True),
    # GPT-2 small's shape (124 M parameters with its 50257-token vocabulary).
    "gpt2": ModelConfig(vocab_size=50257, d_model=768, num_heads=12, num_layers=12, max_len=1024,
                        activation="gelu_tanh"),
}


@dataclass
class ModelOutput:
    """What a model returns; fields a model does not produce stay None."""

    logits: Tensor | None = None  # (B, T, V)
    loss: Tensor | None = None  # scalar, mean cross-entropy in nats per token
    last_hidden_state: Tensor | None = None  # (B, T, C)
    attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, S)
    cross_attentions: tuple[Tensor, ...] | None = None  # per decoder layer (B, H, T, S_src)


class Embeddings(nn.Module):
    """Token embedding + absolute position (sinusoidal or learned) + token type, then norm and dropout."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        if config.positional == "sinusoidal":
            self.pos = SinusoidalPositionalEncoding(config.d_model)
        elif config.positional == "learned":
            self.pos = LearnedPositionalEmbedding(config.max_len, config.d_model)
        else:
            self.pos = None  # none, or position applied inside attention (rope, alibi)
        self.token_type = nn.Embedding(config.type_vocab_size, config.d_model) if config.type_vocab_size else None
        self.norm = make_norm(config.norm, config.d_model, config.norm_eps) if config.embedding_norm else None
        self.drop = nn.Dropout(config.dropout)
        self.vocab_size = config.vocab_size
        # Without it, N(0, 0.02) token vectors are drowned by sinusoids of amplitude 1.
        self.scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0

    def forward(self, ids: Tensor, positions: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """ids (B, T), positions (B, T) or (T,) -> (B, T, C)."""
        if ids.numel() and not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(ids))  # one reduction, one sync
            if low < 0 or high >= self.vocab_size:
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got range [{low}, {high}]")
        x = self.tok(ids) * self.scale  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x)


def _blocks(config: ModelConfig, n: int, *, cross_attention: bool = False) -> nn.ModuleList:
    """n blocks sharing one (parameter-free) RoPE or ALiBi module."""
    rope = alibi = None
    if config.positional == "rope":
        rope = RotaryEmbedding(config.head_dim, config.rope_base, config.rope_interleaved)
    elif config.positional == "alibi":
        alibi = ALiBi(config.num_heads)
    return nn.ModuleList(
        TransformerBlock(
            config.d_model, config.num_heads, config.ff_width,
            norm_first=config.norm_first, cross_attention=cross_attention, dropout=config.dropout,
            num_kv_heads=config.num_kv_heads, activation=config.activation, norm=config.norm,
            norm_eps=config.norm_eps, bias=config.bias, rope=rope, alibi=alibi,
        )
        for _ in range(n)
    )


def _init_weights(model: nn.Module, num_layers: int) -> None:
    """GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled by 1/√(2·layers)."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("out_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, std=std)


def _key_mask(mask: Tensor | None, batch: int, keys: int) -> Tensor | None:
    """A (B, S) validity mask -> (B, 1, 1, S); a 4-D bool mask passes through."""
    if mask is None or mask.dim() == 4:
        return mask
    if mask.dtype != torch.bool or mask.shape != (batch, keys):
        raise ValueError(f"mask must be bool (B={batch}, S={keys}) with True on real tokens, "
                         f"got {mask.dtype} {tuple(mask.shape)}")
    return padding_mask(mask)


def _positions(mask: Tensor | None, offset: int, T: int, device) -> Tensor:
    """Absolute positions of the T new tokens: offset … offset+T−1, or counted over real tokens only."""
    if mask is None:
        return torch.arange(offset, offset + T, device=device)  # (T,)
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T): left padding does not shift positions


def _static_positions_and_mask(slots: Tensor, input_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Static cache: slots (B, M) True where real tokens are (being) written; new tokens at input_pos (T,).

    Returns absolute positions (B, T), counted over real tokens, and the mask (B, 1, T, M).
    """
    positions = (slots.long().cumsum(-1) - 1).clamp(min=0).index_select(1, input_pos)  # (B, T)
    causal = torch.arange(slots.size(1), device=slots.device) <= input_pos[:, None]  # (T, M)
    return positions, slots[:, None, None, :] & causal  # (B, 1, T, M)


def _check_ids(ids: Tensor) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be an integer tensor (B, T), got {got}")


class GPT(nn.Module):
    """A decoder-only language model (Radford et al. 2019; nanoGPT's shape), causal self-attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = _blocks(config, config.num_layers)
        self.final_norm = make_norm(config.norm, config.d_model, config.norm_eps) if config.has_final_norm else None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _init_weights(self, config.num_layers)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.tok.weight

    def new_kv_caches(self, batch_size: int, max_len: int, *, dtype=None, device=None) -> list[KVCache]:
        """One preallocated cache per layer."""
        c = self.config
        dtype = dtype or self.lm_head.weight.dtype
        device = device or self.lm_head.weight.device
        kv_heads = c.num_kv_heads or c.num_heads
        return [KVCache(batch_size, kv_heads, max_len, c.head_dim, dtype=dtype, device=device)
                for _ in range(c.num_layers)]

    def forward(
        self,
        ids: Tensor,
        *,
        targets: Tensor | None = None,
        mask: Tensor | None = None,
        return_attention: bool = False,
        kv_caches: list[KVCache] | None = None,
        input_pos: Tensor | None = None,
    ) -> ModelOutput:
        """ids (B, T) -> logits (B, T, V); loss when targets (B, T) are given (-100 = ignore).

        ``mask``: bool (B, S) True on real tokens, S = cached + new tokens (left padding for
        batched generation). ``kv_caches``: from ``new_kv_caches``, for incremental decoding.
        ``input_pos`` (T,): static-cache decoding (what ``generate`` and its compiled step use):
        the tokens go to those cache slots and ``mask`` (B, M) marks the slots holding real tokens.
        """
        _check_ids(ids)
        B, T = ids.shape
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} kv_caches (one per layer), got {len(kv_caches)}")
        if input_pos is None:
            offset = kv_caches[0].pos if kv_caches else 0
            positions, attn_mask = _positions(mask, offset, T, ids.device), _key_mask(mask, B, offset + T)
        else:
            if kv_caches is None or mask is None or mask.shape != (B, kv_caches[0].max_len):
                raise ValueError("input_pos needs kv_caches and a mask (B, M) of the cache slots holding tokens")
            positions, attn_mask = _static_positions_and_mask(mask, input_pos)
        x = self.embed(ids, positions)  # (B, T, C)
        attentions = []
        for i, block in enumerate(self.blocks):
            cache = kv_caches[i] if kv_caches else None
            r = block(x, mask=attn_mask, is_causal=input_pos is None, kv_cache=cache, input_pos=input_pos,
                      return_weights=return_attention)
            x = r[0] if return_attention else r
            if return_attention:
                attentions.append(r[1])
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            if targets.shape != ids.shape:
                raise ValueError(f"targets must have the shape of ids {tuple(ids.shape)}, got {tuple(targets.shape)}")
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        return ModelOutput(logits=logits, loss=loss, last_hidden_state=x,
                           attentions=tuple(attentions) if return_attention else None)

    def generate(self, ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """Autoregressive sampling; see ``qkv.generate.generate`` for the keyword arguments."""
        from .generate import generate

        return generate(self, ids, max_new_tokens, **kwargs)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Encoder(nn.Module):
    """A bidirectional encoder (BERT's shape): every token attends to every real token."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = _blocks(config, config.num_layers)
        self.final_norm = make_norm(config.norm, config.d_model, config.norm_eps) if config.has_final_norm else None
        _init_weights(self, config.num_layers)

    def forward(
        self, ids: Tensor, *, mask: Tensor | None = None, token_type_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> ModelOutput:
        """ids (B, T), mask bool (B, T) True on real tokens -> last_hidden_state (B, T, C)."""
        _check_ids(ids)
        B, T = ids.shape
        x = self.embed(ids, torch.arange(T, device=ids.device), token_type_ids)  # (B, T, C)
        attn_mask = _key_mask(mask, B, T)
        attentions = []
        for block in self.blocks:
            r = block(x, mask=attn_mask, return_weights=return_attention)
            x = r[0] if return_attention else r
            if return_attention:
                attentions.append(r[1])
        if self.final_norm is not None:
            x = self.final_norm(x)
        return ModelOutput(last_hidden_state=x, attentions=tuple(attentions) if return_attention else None)


class Transformer(nn.Module):
    """The paper's encoder-decoder: the decoder attends causally to itself and fully to the encoder."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.embed = Embeddings(config)
        self.blocks = _blocks(config, config.num_decoder_layers or config.num_layers, cross_attention=True)
        self.final_norm = make_norm(config.norm, config.d_model, config.norm_eps) if config.has_final_norm else None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _init_weights(self, config.num_layers)
        if config.tie_embeddings:  # one shared vocabulary, as in the paper (§3.4)
            self.embed.tok.weight = self.encoder.embed.tok.weight
            self.lm_head.weight = self.encoder.embed.tok.weight

    def forward(
        self, src_ids: Tensor, tgt_ids: Tensor, *, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
        targets: Tensor | None = None, return_attention: bool = False,
    ) -> ModelOutput:
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V); masks bool, True on real tokens."""
        _check_ids(tgt_ids)
        memory = self.encoder(src_ids, mask=src_mask).last_hidden_state  # (B, S, C)
        B, T = tgt_ids.shape
        x = self.embed(tgt_ids, _positions(tgt_mask, 0, T, tgt_ids.device))  # (B, T, C)
        self_mask = _key_mask(tgt_mask, B, T)
        cross_mask = _key_mask(src_mask, B, memory.size(1))
        attentions, cross = [], []
        for block in self.blocks:
            r = block(x, memory, mask=self_mask, is_causal=True, context_mask=cross_mask,
                      return_weights=return_attention)
            x = r[0] if return_attention else r
            if return_attention:
                attentions.append(r[1])
                cross.append(r[2])
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        return ModelOutput(logits=logits, loss=loss, last_hidden_state=x,
                           attentions=tuple(attentions) if return_attention else None,
                           cross_attentions=tuple(cross) if return_attention else None)
