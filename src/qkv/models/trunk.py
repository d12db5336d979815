"""The body every model here shares: embeddings, N blocks from the factory, a final norm.

    x = Embed(ids) [+ PE(positions)] [+ TypeEmbed(types)] → [Norm] → N × Block → [Norm]

``positions`` are tokens' absolute positions; ``input_pos`` are static-KV-cache slots.
Shapes: B batch, T length, S source/key length, C model width, V vocabulary, H heads,
G key/value heads, D head width, M static-cache capacity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.kv_cache import KVCache, RingKVCache, static_positions
from ..nn.latent_attention import LatentCache
from ..nn.paged_kv_cache import PagedKVCache, PagedLatentCache
from ..nn.masks import PreparedMask, causal_mask, causal_mask_at, padding_mask, prepare_mask, within_window
from . import components
from .config import ModelConfig


@dataclass
class ModelOutput:
    """What a model returns; fields a model does not produce stay None."""

    logits: Tensor | None = None  # (B, T, V)
    loss: Tensor | None = None  # scalar, mean cross-entropy in nats per token
    last_hidden_state: Tensor | None = None  # (B, T, C)
    attentions: tuple[Tensor, ...] | None = None  # per layer (B, H, T, S)
    cross_attentions: tuple[Tensor, ...] | None = None  # per decoder layer (B, H, T, S_src)
    router_logits: tuple[Tensor, ...] | None = None  # per mixture-of-experts layer (B·T, E), where asked


class Embeddings(nn.Module):
    """Token embedding + absolute position (sinusoidal or learned) + token type, then norm and dropout."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e = config.embedding
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = components.embedding_position(config)  # None: no PE, or PE inside attention (rope, alibi, t5)
        self.token_type = nn.Embedding(e.type_vocab_size, config.d_model) if e.type_vocab_size else None
        self.norm = components.norm_factory(config)() if e.norm else None
        self.drop = nn.Dropout(config.dropout)
        self.vocab_size = config.vocab_size
        # Without it, N(0, 0.02) token vectors are drowned by sinusoids of amplitude 1.
        self.scale = math.sqrt(config.d_model) if e.scale else 1.0
        # Gemma: x · tensor(√C, dtype=x.dtype), the factor rounded first; kept as Python numbers (no tensor made on
        # the device in the forward: a recorded CUDA graph cannot copy from the host)
        rounded = (torch.float16, torch.bfloat16) if e.scale_in_dtype else ()
        self.scales = {dt: torch.tensor(self.scale, dtype=dt, device="cpu").item() for dt in rounded}

    def forward(self, ids: Tensor, positions: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """ids (B, T), positions (B, T) or (T,) -> (B, T, C)."""
        if ids.numel() and ids.is_cpu and not torch.compiler.is_compiling():  # on a GPU: the embedding's own assert
            low, high = (int(v) for v in torch.aminmax(ids))  # one reduction, one sync
            if low < 0 or high >= self.vocab_size:
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got range [{low}, {high}]")
        x = self.tok(ids)  # (B, T, C)
        if self.scale != 1.0:
            x = x * self.scales.get(x.dtype, self.scale)
        if self.pos is not None:
            x = x + self.pos(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x) if self.training else x


def init_weights(model: nn.Module, num_layers: int, *, skip: str | None = None) -> None:
    """GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled by 1/√(2·layers).

    ``num_layers`` is the depth of the residual stream the projections add to; parameters
    whose names start with ``skip`` are left alone (a submodule initialised by its own depth).
    """
    for name, p in model.named_parameters():
        if skip is not None and name.startswith(skip):
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif name.endswith("embed.tok.weight") and model.config.embedding.init_std is not None:
            nn.init.normal_(p, std=model.config.embedding.init_std)
        elif p.dim() >= 2:
            residual = name.endswith(("out_proj.weight", "down_proj.weight", "attn.o_proj.weight",  # o_proj: MLA's
                                      "experts.down_proj"))  # qkv.nn.moe's stacked (E, C, I)
            std = 0.02 / math.sqrt(2 * num_layers) if residual else 0.02
            nn.init.normal_(p, std=std)


def key_mask(mask: Tensor | None, batch: int, keys: int) -> Tensor | None:
    """A (B, S) validity mask -> (B, 1, 1, S); a 4-D bool mask passes through."""
    if mask is None or mask.dim() == 4:
        return mask
    if mask.dtype != torch.bool or mask.shape != (batch, keys):
        raise ValueError(f"mask must be bool (B={batch}, S={keys}) with True on real tokens, "
                         f"got {mask.dtype} {tuple(mask.shape)}")
    return padding_mask(mask)


def positions_of_new_tokens(mask: Tensor | None, start: int, T: int, device) -> Tensor:
    """Positions of the last T tokens: start … start+T−1, or, with a mask (B, S), counted over real tokens."""
    if mask is None:
        return torch.arange(start, start + T, device=device)  # (T,)
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # (B, T): left padding does not shift positions


def document_positions_and_mask(document_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Packed rows (several documents one after another, ``document_ids`` (B, T) equal within each): positions
    restarting at 0 at each document's first token (B, T), and the mask (B, 1, T, T) keeping attention within a
    document (the causal part is added by ``layer_masks``)."""
    if not isinstance(document_ids, Tensor) or document_ids.dim() != 2 or document_ids.is_floating_point():
        got = f"{document_ids.dtype} {tuple(document_ids.shape)}" if isinstance(document_ids, Tensor) else \
            type(document_ids).__name__
        raise ValueError(f"document_ids must be an integer tensor (B, T), got {got}")
    T = document_ids.size(1)
    places = torch.arange(T, device=document_ids.device).expand_as(document_ids)  # (B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]  # (B, T): a document begins here
    first = torch.where(starts, places, torch.zeros_like(places)).cummax(-1).values  # (B, T): its document's start
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    return places - first, same[:, None]


def static_positions_and_mask(slots: Tensor, input_pos: Tensor) -> tuple[Tensor, Tensor]:
    """``static_positions`` and the mask (B, 1, T, M): each new token sees the real slots up to its own.
    ``input_pos``: (T,) the same slots in every row, or (B, T) each row's own."""
    positions = static_positions(slots, input_pos)  # (B, T)
    causal = causal_mask_at(input_pos, torch.arange(slots.size(1), device=slots.device))  # (T, M) or (B, T, M)
    causal = causal if causal.dim() == 2 else causal[:, None]  # (B, T, M) -> (B, 1, T, M)
    return positions, slots[:, None, None, :] & causal  # (B, 1, T, M)


def layer_masks(config: ModelConfig, mask: Tensor | None, is_causal: bool, q_len: int, k_len: int,
                input_pos: Tensor | None, dtype) -> dict[str, tuple[PreparedMask | None, bool]]:
    """Per layer type, the (mask, is_causal) its blocks attend under, each prepared once per forward.

    ``mask``: bool (..., L, S) or None, True = may attend; ``k_len``: S when there is no mask. A
    sliding_attention layer adds the window (keys p − W < j ≤ p, p the query's place on the key axis:
    bottom-right, or its static slot ``input_pos``), over key places as Hugging Face's cache positions;
    left or right padding shifts a row's real tokens together, so a padded row sees what it would alone.
    """
    device = None if mask is None else mask.device
    full = None if mask is None else mask & causal_mask(q_len, mask.size(-1), device=device) if is_causal else mask
    masks = {"full_attention": (None, is_causal) if full is None else (prepare_mask(full, dtype), False)}
    W = config.attention.sliding_window
    if W is not None:
        k_len = k_len if full is None else full.size(-1)
        places = torch.arange(k_len, device=device)  # (S,)
        q_places = input_pos if input_pos is not None else places[k_len - q_len:]  # (L,)
        base = causal_mask(q_len, k_len, device=device) if full is None else full
        window = within_window(q_places, places, W)  # (L, S), or (B, L, S) for per-row input_pos
        window = window if window.dim() == 2 else window[:, None]  # (B, L, S) -> (B, 1, L, S)
        masks["sliding_attention"] = (prepare_mask(base & window, dtype), False)
    return masks


def check_token_ids(ids: Tensor, name: str = "ids") -> None:
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
        self.layer_types = [config.layer_type(i) for i in range(num_layers)]
        if "sliding_attention" in self.layer_types and (cross_attention or not isinstance(self, CausalTrunk)):
            raise ValueError(f"sliding_attention layers are built for decoder-only models (qkv.GPT), not "
                             f"{type(self).__name__}")
        self.embed = Embeddings(config)
        self.blocks = components.blocks(config, num_layers, cross=cross_attention, causal=isinstance(self, CausalTrunk))
        self.final_norm = components.norm_factory(config)() if config.has_final_norm else None

    def run_trunk(
        self, ids: Tensor, positions: Tensor, *, mask: Tensor | None, is_causal: bool = False,
        cross_kv: list[tuple[Tensor, Tensor]] | None = None, cross_mask: Tensor | None = None,
        kv_caches: list[KVCache] | None = None, input_pos: Tensor | None = None,
        token_type_ids: Tensor | None = None, return_attention: bool = False, return_router_logits: bool = False,
    ) -> ModelOutput:
        """ids (B, T) at ``positions`` -> last_hidden_state (B, T, C) [, attentions, cross_attentions]
        [, router_logits].

        ``cross_kv``: per block, the source's cross-attention keys and values (decoders of the
        encoder-decoder). ``kv_caches`` / ``input_pos``: per block, as ``TransformerBlock``.
        """
        x = self.embed(ids, positions, token_type_ids)  # (B, T, C)
        start = kv_caches[0].pos if kv_caches is not None and input_pos is None else 0
        masks = layer_masks(self.config, mask, is_causal, ids.size(1), start + ids.size(1), input_pos,
                            x.dtype)  # once for every block, not once per block
        cross_mask = None if cross_mask is None else prepare_mask(cross_mask, x.dtype)
        attentions, cross_attentions, router_logits = [], [], []
        rope_positions = positions if self.rope_follows_length() else None  # real positions, padding not counted
        for i, block in enumerate(self.blocks):
            mask, is_causal = masks[self.layer_types[i]]
            out = block(
                x, context_kv=None if cross_kv is None else cross_kv[i], mask=mask, is_causal=is_causal,
                context_mask=cross_mask, kv_cache=None if kv_caches is None else kv_caches[i],
                input_pos=input_pos, return_weights=return_attention, rope_positions=rope_positions,
                return_router_logits=return_router_logits,
            )
            x = out.hidden
            attentions.append(out.self_attention)
            cross_attentions.append(out.cross_attention)
            if return_router_logits and out.router_logits is not None:
                router_logits.append(out.router_logits)
        if self.final_norm is not None:
            x = self.final_norm(x)
        routed = tuple(router_logits) if return_router_logits else None
        if not return_attention:
            return ModelOutput(last_hidden_state=x, router_logits=routed)
        return ModelOutput(last_hidden_state=x, attentions=tuple(attentions), router_logits=routed,
                           cross_attentions=tuple(cross_attentions) if cross_kv is not None else None)

    def rope_follows_length(self) -> bool:
        """Some block's self-attention rotates with a RoPE whose table follows the length (dynamic, longrope):
        it then rotates at real positions (``RotaryEmbedding.places``)."""
        return any(getattr(getattr(b.attn, "rope", None), "follows_length", False) for b in self.blocks)

    def num_parameters(self) -> int:
        """How many numbers the model holds; a tied matrix counts once."""
        return sum(p.numel() for p in self.parameters())


class CausalTrunk(Trunk):
    """A trunk that decodes left to right: causal self-attention, KV caches, left-padded batches."""

    def new_kv_caches(self, batch_size: int, max_len: int, *, dtype=None, device=None) -> list[KVCache | RingKVCache]:
        """One preallocated cache per block: the block's attention's own where it makes one (``new_cache``:
        MLA's latent or naive cache, as attention.latent_cache says), a sliding layer's keeping only its window
        (a ``RingKVCache``), else a ``KVCache``."""
        c, weight = self.config, self.embed.tok.weight
        kw = dict(dtype=dtype or weight.dtype, device=device or weight.device)
        W = c.attention.sliding_window
        caches = []
        for kind, block in zip(self.layer_types, self.blocks):
            if hasattr(block.attn, "new_cache"):
                caches.append(block.attn.new_cache(batch_size, max_len, mode=c.attention.latent_cache, **kw))
            elif kind == "sliding_attention":
                caches.append(RingKVCache(batch_size, c.kv_heads, min(W, max_len), c.head_dim, max_len=max_len, **kw))
            else:
                caches.append(KVCache(batch_size, c.kv_heads, max_len, c.head_dim, **kw))
        return caches

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
            return positions_of_new_tokens(mask, start, T, ids.device), key_mask(mask, B, start + T)
        if kv_caches is None or mask is None or mask.shape != (B, kv_caches[0].max_len):
            raise ValueError("input_pos needs kv_caches and a mask (B, M) of the cache slots holding tokens")
        per_row = (KVCache, RingKVCache, LatentCache, PagedKVCache, PagedLatentCache)
        if input_pos.dim() == 2 and (other := next((c for c in kv_caches if type(c) not in per_row), None)):
            raise ValueError(f"per-row input_pos (B, T) needs a KVCache, RingKVCache or LatentCache in every layer, "
                             f"got a "
                             f"{type(other).__name__}")
        return static_positions_and_mask(mask, input_pos)
