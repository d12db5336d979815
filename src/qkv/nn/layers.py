"""Position-wise feed-forward networks and normalisation layers.

Shapes: B batch, T length, C model width, F feed-forward width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_fraction, check_positive_int


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation (GPT-2's "gelu_new")."""
    return F.gelu(x, approximate="tanh")


@dataclass(frozen=True)
class Activation:
    """A feed-forward activation: the elementwise function ``base`` names, applied to W_up x, or gating it
    (GLU variants: act(W_gate x) ⊙ W_up x; Shazeer 2020, "GLU variants improve Transformer")."""

    fn: Callable[[Tensor], Tensor]
    base: str  # the elementwise function's own name: "silu" for swiglu
    gated: bool = False


ACTIVATIONS = {  # the one table of qkv's activations; the kernels and the interop read it
    "relu": Activation(F.relu, "relu"),
    "gelu": Activation(F.gelu, "gelu"),  # exact erf form (BERT, the original Transformer's successors)
    "gelu_tanh": Activation(gelu_tanh, "gelu_tanh"),
    "silu": Activation(F.silu, "silu"),
    "swiglu": Activation(F.silu, "silu", gated=True),  # LLaMA
    "geglu": Activation(F.gelu, "gelu", gated=True),
}
NORMS = ("layernorm", "rmsnorm")


def get_activation(name: str) -> Activation:
    """The activation called ``name``; ValueError listing the known ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """FFN(x) = W_down · act(W_up x)  (Vaswani et al. §3.3), or gated: W_down · (act(W_gate x) ⊙ W_up x).

    ``activation``: relu | gelu | gelu_tanh | silu, or the gated swiglu | geglu (LLaMA uses swiglu).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        act = get_activation(activation)
        for name, value in (("d_model", d_model), ("d_ff", d_ff)):
            check_positive_int(name, value)
        check_fraction("dropout", dropout)
        self.activation, self.act = activation, act.fn
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias) if act.gated else None
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        if self.gate_proj is None:
            h = self.act(self.up_proj(x))  # (B, T, F)
        else:
            h = self.act(self.gate_proj(x)) * self.up_proj(x)  # (B, T, F)
        return self.down_proj(self.dropout(h) if self.training else h)


def make_norm(kind: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019, LLaMA) over the last dim."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
