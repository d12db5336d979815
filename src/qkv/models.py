"""Models built from the blocks: a decoder-only LM (GPT), a bidirectional Encoder, and the
paper's encoder-decoder Transformer.

    x = Embed(ids) [+ PE(positions)] [+ TypeEmbed(types)] → [Norm] → N × Block → [Norm] → head

Everything before the head is one ``Trunk`` that the three models share (the Transformer's
decoder is one; its encoder is an ``Encoder``). ``positions`` are tokens' absolute positions;
``input_pos`` are static-KV-cache slots.

Shapes: B batch, T length, S source/key length, C model width, V vocabulary, H heads,
G key/value heads, D head width, M static-cache capacity.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import TransformerBlock
from .kv_cache import KVCache, static_positions
from .layers import ACTIVATIONS, GATED, NORMS, make_norm
from .linear import Linear
from .masks import causal_mask, padding_mask, prepare_mask
from .positional import (
    SINUSOIDAL_LAYOUTS, ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
)

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
    sinusoidal_layout: str = "interleaved"  # interleaved (the paper) | split (sines, then cosines: Marian)
    logits_bias: bool = False  # encoder-decoder only: a bias on the LM head (Marian's final_logits_bias)
    embed_init_std: float | None = None  # token embeddings' initial std; None: GPT-2's 0.02 (the paper's d^-0.5
    #                                      keeps scaled embeddings, × √d_model, at the amplitude of sinusoidal PE)

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
        if self.embed_init_std is not None and (isinstance(self.embed_init_std, bool) or
                                                not isinstance(self.embed_init_std, (int, float)) or
                                                not self.embed_init_std > 0):
            raise ValueError(f"embed_init_std must be a positive number or None, got {self.embed_init_std!r}")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"sinusoidal_layout must be one of {SINUSOIDAL_LAYOUTS}, got {self.sinusoidal_layout!r}")
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
    # `qkv train --task translate`: the paper's encoder-decoder at CPU size (shared 8000-token BPE vocabulary).
    # Side by side over 400 steps of 64 pairs, d_model 256 / 3 + 3 layers reached the validation loss of
    # d_model 128 / 2 + 2 (3.30 nats) at half the speed, so the smaller one goes further in minutes.
    # Token embeddings start at std d^-0.5 (the paper's scale): after 400 steps the validation loss was 2.97
    # nats where GPT-2's 0.02 gave 3.28 (same seed, data and steps).
    "translate": ModelConfig(vocab_size=8000, d_model=128, num_heads=4, num_layers=2, d_ff=512, max_len=96,
                             positional="sinusoidal", norm_first=True, activation="relu", scale_embeddings=True,
                             embed_init_std=128 ** -0.5),
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
            self.pos = SinusoidalPositionalEncoding(config.d_model, layout=config.sinusoidal_layout)
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
        x = self.tok(ids) if self.scale == 1.0 else self.tok(ids) * self.scale  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x) if self.training else x


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


def _init_weights(model: nn.Module, num_layers: int, *, skip: str | None = None) -> None:
    """GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled by 1/√(2·layers).

    ``num_layers`` is the depth of the residual stream the projections add to; parameters
    whose names start with ``skip`` are left alone (a submodule initialised by its own depth).
    """
    for name, p in model.named_parameters():
        if skip is not None and name.startswith(skip):
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif name.endswith("embed.tok.weight") and model.config.embed_init_std is not None:
            nn.init.normal_(p, std=model.config.embed_init_std)
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


def _positions_of_new_tokens(mask: Tensor | None, start: int, T: int, device) -> Tensor:
    """Positions of the last T tokens: start … start+T−1, or, with a mask (B, S), counted over real tokens."""
    if mask is None:
        return torch.arange(start, start + T, device=device)  # (T,)
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T): left padding does not shift positions


def _static_positions_and_mask(slots: Tensor, input_pos: Tensor) -> tuple[Tensor, Tensor]:
    """``static_positions`` and the mask (B, 1, T, M): each new token sees the real slots up to its own."""
    positions = static_positions(slots, input_pos)  # (B, T)
    causal = torch.arange(slots.size(1), device=slots.device) <= input_pos[:, None]  # (T, M)
    return positions, slots[:, None, None, :] & causal  # (B, 1, T, M)


def _check_token_ids(ids: Tensor, name: str = "ids") -> None:
    """ids must be an integer (B, T) tensor (the vocabulary range is checked by the embedding)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor (B, T), got {got}")


def token_cross_entropy(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0,
                        normalized: bool = False) -> Tensor:
    """Mean cross-entropy in nats per token of logits (B, T, V) against targets (B, T); -100 = ignore.

    ``label_smoothing`` ε: the target distribution puts 1 − ε on the target and spreads ε over
    the vocabulary (Szegedy et al. 2016; the paper trains with ε = 0.1, §5.4).
    ``normalized``: the logits are already log-probabilities (``qkv.pointer``'s); the same loss
    without a second log_softmax.
    """
    if not isinstance(targets, Tensor) or targets.shape != logits.shape[:-1] or targets.is_floating_point():
        got = f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets must be an integer tensor with the shape of ids {tuple(logits.shape[:-1])}, "
                         f"got {got}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if normalized:
        valid = targets != -100  # (B, T)
        nll = -logits.gather(-1, targets.clamp(min=0)[..., None])[..., 0]  # (B, T)
        smooth = -logits.mean(-1) if label_smoothing else 0.0  # (B, T): against the uniform distribution
        return (((1 - label_smoothing) * nll + label_smoothing * smooth) * valid).sum() / valid.sum()
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                           label_smoothing=label_smoothing)  # (B·T, V) against (B·T,)


class Trunk(nn.Module):
    """Embeddings → N blocks → final norm: the body every model here shares.

    The models subclass it (rather than hold it) so their weights keep the names
    ``embed.*``, ``blocks.N.*`` and ``final_norm.*`` that checkpoints and the HF tables use.
    """

    def __init__(self, config: ModelConfig, num_layers: int, *, cross_attention: bool = False) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = _blocks(config, num_layers, cross_attention=cross_attention)
        self.final_norm = make_norm(config.norm, config.d_model, config.norm_eps) if config.has_final_norm else None

    def run_trunk(
        self, ids: Tensor, positions: Tensor, *, mask: Tensor | None, is_causal: bool = False,
        cross_kv: list[tuple[Tensor, Tensor]] | None = None, cross_mask: Tensor | None = None,
        kv_caches: list[KVCache] | None = None, input_pos: Tensor | None = None,
        token_type_ids: Tensor | None = None, return_attention: bool = False,
    ) -> ModelOutput:
        """ids (B, T) at ``positions`` -> last_hidden_state (B, T, C) [, attentions, cross_attentions].

        ``cross_kv``: per block, the source's cross-attention keys and values (decoders of the
        encoder-decoder). ``kv_caches`` / ``input_pos``: per block, as ``TransformerBlock``.
        """
        x = self.embed(ids, positions, token_type_ids)  # (B, T, C)
        if mask is not None:  # once for every block, not once per block
            mask = prepare_mask(mask & causal_mask(ids.size(1), mask.size(-1), device=ids.device) if is_causal
                                else mask, x.dtype)
            is_causal = False
        cross_mask = None if cross_mask is None else prepare_mask(cross_mask, x.dtype)
        attentions, cross_attentions = [], []
        for i, block in enumerate(self.blocks):
            x, w_self, w_cross = block(
                x, context_kv=None if cross_kv is None else cross_kv[i], mask=mask, is_causal=is_causal,
                context_mask=cross_mask, kv_cache=None if kv_caches is None else kv_caches[i],
                input_pos=input_pos, return_weights=return_attention,
            )
            attentions.append(w_self)
            cross_attentions.append(w_cross)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if not return_attention:
            return ModelOutput(last_hidden_state=x)
        return ModelOutput(last_hidden_state=x, attentions=tuple(attentions),
                           cross_attentions=tuple(cross_attentions) if cross_kv is not None else None)

    def num_parameters(self) -> int:
        """How many numbers the model holds; a tied matrix counts once."""
        return sum(p.numel() for p in self.parameters())


class CausalTrunk(Trunk):
    """A trunk that decodes left to right: causal self-attention, KV caches, left-padded batches."""

    def new_kv_caches(self, batch_size: int, max_len: int, *, dtype=None, device=None) -> list[KVCache]:
        """One preallocated cache per block."""
        c, weight = self.config, self.embed.tok.weight
        kv_heads = c.num_kv_heads or c.num_heads
        return [KVCache(batch_size, kv_heads, max_len, c.head_dim, dtype=dtype or weight.dtype,
                        device=device or weight.device) for _ in self.blocks]

    def causal_inputs(
        self, ids: Tensor, mask: Tensor | None, kv_caches: list[KVCache] | None, input_pos: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """The new tokens' positions (T,) or (B, T) and the self-attention mask, for ``run_trunk``.

        ``mask`` (B, S): True on real tokens, S = cached + new; with ``input_pos`` (static cache
        slots of the new tokens), (B, M): True on the slots holding real tokens.
        """
        B, T = ids.shape
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} kv_caches (one per layer), got {len(kv_caches)}")
        if input_pos is None:
            start = kv_caches[0].pos if kv_caches else 0
            return _positions_of_new_tokens(mask, start, T, ids.device), _key_mask(mask, B, start + T)
        if kv_caches is None or mask is None or mask.shape != (B, kv_caches[0].max_len):
            raise ValueError("input_pos needs kv_caches and a mask (B, M) of the cache slots holding tokens")
        return _static_positions_and_mask(mask, input_pos)


class GPT(CausalTrunk):
    """A decoder-only language model (Radford et al. 2019; nanoGPT's shape), causal self-attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, config.num_layers)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        _init_weights(self, config.num_layers)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.tok.weight

    def forward(
        self,
        ids: Tensor,
        *,
        targets: Tensor | None = None,
        mask: Tensor | None = None,
        return_attention: bool = False,
        kv_caches: list[KVCache] | None = None,
        input_pos: Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """ids (B, T) -> logits (B, T, V); loss when targets (B, T) are given (-100 = ignore).

        ``mask``: bool (B, S) True on real tokens, S = cached + new tokens (left padding for
        batched generation). ``kv_caches``: from ``new_kv_caches``, for incremental decoding.
        ``input_pos`` (T,): static-cache decoding (what ``generate`` and its compiled step use):
        the tokens go to those cache slots and ``mask`` (B, M) marks the slots holding real tokens.
        ``logits_to_keep``: logits of the last N positions only (B, N, V), as Hugging Face's; 0: all.
        """
        _check_token_ids(ids)
        if not isinstance(logits_to_keep, int) or logits_to_keep < 0 or (logits_to_keep and targets is not None):
            raise ValueError(f"logits_to_keep must be an int >= 0, and 0 with targets (the loss needs every "
                             f"position's logits), got {logits_to_keep!r}")
        positions, attn_mask = self.causal_inputs(ids, mask, kv_caches, input_pos)
        out = self.run_trunk(ids, positions, mask=attn_mask, is_causal=input_pos is None, kv_caches=kv_caches,
                             input_pos=input_pos, return_attention=return_attention)
        out.logits = self.lm_head(out.last_hidden_state[:, -logits_to_keep:])  # (B, T or N, V)
        out.loss = None if targets is None else token_cross_entropy(out.logits, targets)
        return out

    def generate(self, ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """Autoregressive sampling; see ``qkv.generate.generate`` for the keyword arguments."""
        from .generate import generate

        return generate(self, ids, max_new_tokens, **kwargs)


class Encoder(Trunk):
    """A bidirectional encoder (BERT's shape): every token attends to every real token."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, config.num_layers)
        _init_weights(self, config.num_layers)

    def forward(
        self, ids: Tensor, *, mask: Tensor | None = None, token_type_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> ModelOutput:
        """ids (B, T), mask bool (B, T) True on real tokens -> last_hidden_state (B, T, C)."""
        _check_token_ids(ids)
        B, T = ids.shape
        return self.run_trunk(ids, torch.arange(T, device=ids.device), mask=_key_mask(mask, B, T),
                              token_type_ids=token_type_ids, return_attention=return_attention)


class Transformer(CausalTrunk):
    """The paper's encoder-decoder: the decoder attends causally to itself and fully to the encoder.

    ``forward`` = ``decode(encode(src))``. Step-by-step decoding encodes once, projects the
    cross-attention keys and values once (``cross_kv``) and caches the decoder's own
    (``new_kv_caches``); beam search reorders both (``KVCache.reorder``, ``qkv.kv_cache.reorder_kv``).
    """

    def __init__(self, config: ModelConfig) -> None:
        decoder_layers = config.num_decoder_layers or config.num_layers
        super().__init__(config, decoder_layers, cross_attention=True)
        self.encoder = Encoder(config)  # initialised by its own depth, num_layers
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=config.logits_bias)  # bias starts at 0
        _init_weights(self, decoder_layers, skip="encoder.")
        if config.tie_embeddings:  # one shared vocabulary, as in the paper (§3.4)
            self.embed.tok.weight = self.encoder.embed.tok.weight
            self.lm_head.weight = self.encoder.embed.tok.weight

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), src_mask bool (B, S) True on real tokens (right padding) -> memory (B, S, C)."""
        _check_token_ids(src_ids, "src_ids")
        return self.encoder(src_ids, mask=src_mask).last_hidden_state

    def cross_kv(self, memory: Tensor, src_ids: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
        """memory (B, S, C) -> per decoder layer, its cross-attention keys and values, (B, G, S, D) each.

        ``src_ids`` (B, S): unused here; a model that copies source tokens (``qkv.pointer``) needs them.
        """
        return [block.cross_attn.project_kv(memory) for block in self.blocks]

    def decode(
        self, tgt_ids: Tensor, memory: Tensor | None, *, src_ids: Tensor | None = None,
        src_mask: Tensor | None = None, tgt_mask: Tensor | None = None, kv_caches: list[KVCache] | None = None,
        cross_kv: list[tuple[Tensor, Tensor]] | None = None, input_pos: Tensor | None = None,
        return_attention: bool = False,
    ) -> ModelOutput:
        """tgt_ids (B, T) over memory (B, S, C) -> logits (B, T, V) [, attentions, cross_attentions].

        ``cross_kv``: ``self.cross_kv(memory, src_ids)``, computed once per source (memory may then be
        None); ``src_ids`` as in ``cross_kv``. ``kv_caches``, ``input_pos`` and ``tgt_mask`` cache the decoder's self-attention
        as in ``GPT.forward``. Masks are bool, True on real tokens.
        """
        _check_token_ids(tgt_ids, "tgt_ids")
        if cross_kv is None:
            if memory is None:
                raise ValueError("decode needs memory (B, S, C) from encode, or its cross_kv")
            cross_kv = self.cross_kv(memory, src_ids)
        elif len(cross_kv) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} cross_kv pairs (one per decoder layer), got {len(cross_kv)}")
        positions, self_mask = self.causal_inputs(tgt_ids, tgt_mask, kv_caches, input_pos)
        cross_mask = _key_mask(src_mask, tgt_ids.size(0), cross_kv[0][0].size(2))
        out = self.run_trunk(tgt_ids, positions, mask=self_mask, is_causal=input_pos is None, cross_kv=cross_kv,
                             cross_mask=cross_mask, kv_caches=kv_caches, input_pos=input_pos,
                             return_attention=return_attention)
        out.logits = self.lm_head(out.last_hidden_state)  # (B, T, V)
        return out

    def generate(self, src_ids: Tensor, *, src_mask: Tensor | None = None, max_new_tokens: int = 64,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: bool = False, use_cache: bool = True,
                 special=None) -> Tensor:
        """Target ids (B, 1 + n) for sources (B, S): greedy when ``num_beams`` is 1, beam search otherwise.

        ``special``: a ``qkv.beam_search.Special`` (start, end, padding ids); see ``qkv.beam_search.decode``.
        """
        from .beam_search import decode

        if special is None:
            raise ValueError("generate needs special=qkv.beam_search.Special(start=..., eos=..., pad=...): "
                             "the target vocabulary's start, end and padding ids")
        return decode(self, src_ids, src_mask=src_mask, max_new_tokens=max_new_tokens, special=special,
                      num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                      use_cache=use_cache)

    def forward(
        self, src_ids: Tensor, tgt_ids: Tensor, *, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
        targets: Tensor | None = None, label_smoothing: float = 0.0, return_attention: bool = False,
    ) -> ModelOutput:
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V); masks bool, True on real tokens.

        Loss when targets (B, T) are given (-100 = ignore), with optional ``label_smoothing``.
        """
        memory = self.encode(src_ids, src_mask=src_mask)  # (B, S, C)
        out = self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask, return_attention=return_attention)
        if targets is not None:
            out.loss = token_cross_entropy(out.logits, targets, label_smoothing=label_smoothing)
        return out
