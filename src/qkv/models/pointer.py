"""A copy mechanism for the encoder-decoder (pointer-generator; See et al. 2017, "Get To The Point").

    a     = softmax(q(h) · k(memory) / √C)            one attention head from the decoder's output
                                                     h (after its final norm) to the source, padding hidden
    p_gen = sigmoid(w · h + b)
    p(w)  = p_gen · softmax(lm_head(h))_w + (1 − p_gen) · Σ_j a_j [src_j = w]

The vocabulary is shared by both languages (one BPE), so copying scatters the attention onto the
source's ids. ``logits`` are log p: log_softmax leaves log-probabilities unchanged, so cross-entropy
(with label smoothing) and beam search read them as they read any logits.

The source ids travel as one more (keys, ids) pair after the decoder layers' ``cross_kv`` pairs, so
beam search's ``reorder_kv`` moves them with the rest.

Shapes: B batch, S source length, T target length, C model width, V vocabulary.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .encoder_decoder import Transformer
from .trunk import ModelOutput, token_cross_entropy


def copy_distribution(scores: Tensor, src_ids: Tensor, src_mask: Tensor | None, vocab_size: int) -> Tensor:
    """scores (B, T, S), src_ids (B, S), src_mask (B, S) True on real tokens -> p_copy (B, T, V), rows sum to 1.

    The dense form of what ``mix_log_probs`` computes sparsely (for tests and inspection).
    """
    attn = copy_attention(scores, src_mask)  # (B, T, S)
    index = src_ids[:, None, :].expand_as(attn)  # (B, T, S)
    return attn.new_zeros(*attn.shape[:2], vocab_size).scatter_add_(-1, index, attn)  # (B, T, V)


def copy_attention(scores: Tensor, src_mask: Tensor | None) -> Tensor:
    """scores (B, T, S) -> softmax over the real source tokens, float32 (B, T, S)."""
    if src_mask is not None:
        scores = scores.masked_fill(~src_mask[:, None, :], float("-inf"))
    return scores.float().softmax(-1)


def mix_log_probs(logits: Tensor, gate: Tensor, attn: Tensor, src_ids: Tensor) -> Tensor:
    """log(p_gen · softmax(logits) + (1 − p_gen) · p_copy) (B, T, V); p_gen = sigmoid(gate (B, T, 1)),
    p_copy: the copy attention attn (B, T, S) summed per source id (B, S).

    Only the S source ids differ from log p_gen + log_softmax(logits): they are mixed in log space and
    written back; an id that occurs again writes the same value without a second gradient.
    """
    same = src_ids[:, :, None] == src_ids[:, None, :]  # (B, S, S)
    copied = attn @ same.to(attn.dtype)  # (B, T, S): the copy mass of source position j's id
    later = (same & torch.ones_like(same[0]).triu(1)).any(1)  # (B, S): the id occurred before j
    index = src_ids[:, None, :].expand_as(attn)  # (B, T, S)
    base = F.logsigmoid(gate) + logits.float().log_softmax(-1)  # (B, T, V): log p_gen + log p_vocab
    mixed = torch.logaddexp(base.gather(-1, index), F.logsigmoid(-gate) + copied.clamp_min(1e-30).log())
    return base.scatter(-1, index, torch.where(later[:, None, :], mixed.detach(), mixed))  # (B, T, V)


class PointerTransformer(Transformer):
    """``qkv.Transformer`` whose next-token distribution mixes generating with copying a source token.

    Everything else (encoder, decoder, caches, masks) is the parent's; ``decode`` needs the source
    ids, given as ``src_ids`` or carried in ``cross_kv(memory, src_ids)``'s last pair.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        C = config.d_model
        self.copy_query = nn.Linear(C, C, bias=False)
        self.copy_key = nn.Linear(C, C, bias=False)
        self.copy_gate = nn.Linear(C, 1)  # starts at p_gen = 1/2
        for layer in (self.copy_query, self.copy_key, self.copy_gate):
            nn.init.normal_(layer.weight, std=0.02)
        nn.init.zeros_(self.copy_gate.bias)

    def cross_kv(self, memory: Tensor, src_ids: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
        """memory (B, S, C), src_ids (B, S) -> the decoder layers' (k, v) pairs + (copy keys (B, S, C), src_ids)."""
        if src_ids is None or src_ids.shape != memory.shape[:2]:
            got = None if src_ids is None else tuple(src_ids.shape)
            raise ValueError(f"PointerTransformer.cross_kv needs src_ids {tuple(memory.shape[:2])}, got {got}")
        return super().cross_kv(memory) + [(self.copy_key(memory), src_ids)]

    def decode(self, tgt_ids: Tensor, memory: Tensor | None, *, src_ids: Tensor | None = None,
               src_mask: Tensor | None = None, cross_kv: list[tuple[Tensor, Tensor]] | None = None,
               **kwargs) -> ModelOutput:
        """As ``Transformer.decode``, with log p (B, T, V) as logits; ``src_ids`` (B, S) unless ``cross_kv`` holds them."""
        if cross_kv is None:
            if memory is None:
                raise ValueError("decode needs memory (B, S, C) from encode, or its cross_kv")
            cross_kv = self.cross_kv(memory, src_ids)
        if len(cross_kv) != len(self.blocks) + 1:
            raise ValueError(f"expected {len(self.blocks) + 1} cross_kv pairs (one per decoder layer, then the "
                             f"copy keys and source ids), got {len(cross_kv)}")
        *layers, (keys, ids) = cross_kv
        out = super().decode(tgt_ids, None, src_mask=src_mask, cross_kv=layers, **kwargs)
        h = out.last_hidden_state  # (B, T, C)
        scores = self.copy_query(h) @ keys.transpose(1, 2) / math.sqrt(h.size(-1))  # (B, T, S)
        attn = copy_attention(scores, src_mask)  # (B, T, S)
        out.logits = mix_log_probs(out.logits, self.copy_gate(h).float(), attn, ids)  # (B, T, V): log p
        return out

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, *, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, targets: Tensor | None = None, label_smoothing: float = 0.0,
                return_attention: bool = False) -> ModelOutput:
        """As ``Transformer.forward``: src_ids (B, S), tgt_ids (B, T) -> log p (B, T, V) [, loss]."""
        memory = self.encode(src_ids, src_mask=src_mask)  # (B, S, C)
        out = self.decode(tgt_ids, memory, src_ids=src_ids, src_mask=src_mask, tgt_mask=tgt_mask,
                          return_attention=return_attention)
        if targets is not None:
            out.loss = token_cross_entropy(out.logits, targets, label_smoothing=label_smoothing, normalized=True)
        return out
