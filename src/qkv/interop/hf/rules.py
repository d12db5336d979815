"""Weight ``Rule``s: one Hugging Face tensor tied to one or more qkv tensors, with the layout change between them.

One table of rules drives both directions (``from_hf`` reads ``to_qkv``, ``to_hf`` writes ``to_hf``), so a
family's weight mapping is written once. The constructors here are the layout changes families share.

Shapes: C model width, H heads, D head width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ...models import ModelConfig

HEAD = "lm_head.weight"  # weights outside the base model (GPT2LMHeadModel.transformer, MarianMTModel.model, …)
LOGITS_BIAS = "final_logits_bias"  # MarianMTModel's (1, V) buffer added to the logits
TOP_LEVEL = (HEAD, LOGITS_BIAS)  # the keys of this kind the families use


@dataclass(frozen=True)
class Rule:
    """One HF tensor <-> one or more qkv tensors; ``to_hf`` is the exact inverse of ``to_qkv`` (``zero_bias`` apart)."""

    hf: str  # relative to the base model ("h.0.ln_1.weight"), except a family's top-level keys
    qkv: tuple[str, ...]
    to_qkv: Callable[[Tensor], tuple[Tensor, ...]]
    to_hf: Callable[[tuple[Tensor, ...]], Tensor]


def same(hf: str, qkv: str) -> Rule:
    """The same tensor under two names."""
    return Rule(hf, (qkv,), lambda t: (t,), lambda ts: ts[0])


def shared(hf: str, qkv: tuple[str, ...]) -> Rule:
    """One HF matrix that several tied qkv names hold (a tied embedding and LM head)."""
    return Rule(hf, qkv, lambda t: (t,) * len(qkv), lambda ts: ts[0])


def conv1d(hf: str, qkv: str) -> Rule:
    """GPT-2's Conv1D holds W as (in, out); nn.Linear as (out, in)."""
    return Rule(hf, (qkv,), lambda t: (t.t(),), lambda ts: ts[0].t())


def packed_qkv(hf: str, qkv: tuple[str, str, str]) -> Rule:
    """GPT-2's c_attn: weight (C, 3C) = [W_Qᵀ | W_Kᵀ | W_Vᵀ], bias (3C,) = [b_Q | b_K | b_V]."""
    if hf.endswith(".weight"):
        return Rule(hf, qkv, lambda t: tuple(w.t() for w in t.chunk(3, dim=1)),  # (C, 3C) -> 3 × (C, C)
                    lambda ts: torch.cat([w.t() for w in ts], dim=1))
    return Rule(hf, qkv, lambda t: t.chunk(3), lambda ts: torch.cat(ts))


def packed_qkv_per_head(hf: str, qkv: tuple[str, str, str], heads: int) -> Rule:
    """GPT-NeoX's query_key_value: rows grouped by head, each head's q, k and v rows together — weight
    (3·H·D, C) with rows (H, 3, D), bias (3·H·D,) likewise; qkv's q_proj, k_proj, v_proj hold (H·D, …) each."""
    def split(t: Tensor) -> tuple[Tensor, ...]:
        rows = t.reshape(heads, 3, -1, *t.shape[1:])  # (H, 3, D, …)
        return tuple(rows[:, j].reshape(-1, *t.shape[1:]) for j in range(3))  # 3 × (H·D, …)

    def join(ts: tuple[Tensor, ...]) -> Tensor:
        rows = torch.stack([w.reshape(heads, -1, *w.shape[1:]) for w in ts], dim=1)  # (H, 3, D, …)
        return rows.reshape(-1, *ts[0].shape[1:])  # (3·H·D, …)
    return Rule(hf, qkv, split, join)


def stacked_rows(hf: str, qkv: tuple[str, ...], rows: tuple[int, ...]) -> Rule:
    """One HF matrix holding several qkv matrices one under the other (Phi-3's qkv_proj (H·D + 2·G·D, C) =
    [W_Q; W_K; W_V], its gate_up_proj (2F, C) = [W_gate; W_up]); ``rows``: each one's rows."""
    return Rule(hf, qkv, lambda t: tuple(t.split(list(rows), dim=0)), lambda ts: torch.cat(ts, dim=0))


def zero_bias(hf: str, weight: str) -> Rule:
    """A bias the HF layer always has where the qkv projection ``weight`` has none: written as zeros, which
    compute exactly what no bias does. Reading keeps nothing (a config read from HF has that bias, so the
    table read then holds the bias's own rule instead)."""
    return Rule(hf, (weight,), lambda t: (), lambda ts: ts[0].new_zeros(ts[0].size(0)))


def interleaved_to_half_split(w: Tensor, num_heads: int) -> Tensor:
    """Reorder q/k projection rows (H·D, …) so that half-split RoPE computes what interleaved RoPE did.

    In each head, row 2i (rotated with row 2i+1) moves to i and row 2i+1 to i + D/2: the
    permutation of Meta's LLaMA → Hugging Face conversion (convert_llama_weights_to_hf.py).
    """
    D = w.size(0) // num_heads
    return w.reshape(num_heads, D // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (H, D/2, 2, …) -> (H, 2, D/2, …)


def half_split_to_interleaved(w: Tensor, num_heads: int) -> Tensor:
    """The inverse of ``interleaved_to_half_split``."""
    D = w.size(0) // num_heads
    return w.reshape(num_heads, 2, D // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (H, 2, D/2, …) -> (H, D/2, 2, …)


def rope_rows(hf: str, qkv: str, heads: int) -> Rule:
    """A q/k projection of a qkv model with interleaved RoPE, stored half-split as HF LLaMA expects."""
    return Rule(hf, (qkv,), lambda t: (half_split_to_interleaved(t, heads),),
                lambda ts: interleaved_to_half_split(ts[0], heads))


def embedding_and_head(c: ModelConfig, hf: str) -> list[Rule]:
    """A decoder-only model's token embedding and LM head: one tied matrix, or two."""
    if c.head.tie:
        return [shared(hf, ("embed.tok.weight", HEAD))]
    return [same(hf, "embed.tok.weight"), same(HEAD, HEAD)]


def tied_head(hf: str) -> Callable[[ModelConfig], dict[str, str]]:
    """A decoder-only family's ``copies``: a tied LM head is the token embedding under another name."""
    return lambda c: {HEAD: hf} if c.head.tie else {}


def no_copies(c: ModelConfig) -> dict[str, str]:
    """A family whose state dict names each tensor once."""
    return {}
