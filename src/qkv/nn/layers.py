"""Position-wise feed-forward networks, normalisation layers and soft-capping.

Shapes: B batch, T length, C model width, F feed-forward width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
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
    "geglu_tanh": Activation(gelu_tanh, "gelu_tanh", gated=True),  # Gemma's gelu_pytorch_tanh, gated
}
NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")


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


class RMSNormPlusOne(nn.Module):
    """Gemma's RMSNorm: x / √(mean(x²) + eps) · (1 + w), w starting at zero (Gemma 1/2/3; Hugging Face's
    Gemma2RMSNorm). Computed in float32 and cast back after the product, as Gemma does ((x·w).to(dtype),
    where LLaMA's casts before the product)."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., C) -> (..., C)."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., C)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class ProjectionRMSNorm(nn.RMSNorm):
    """RMSNorm over a whole projection's n·D (OLMo-2's q_norm and k_norm), taking and giving its heads (B, n, T, D):
    one mean square per token across every head, not one per head as QK-norm over D."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5) -> None:
        super().__init__(heads * head_dim, eps=eps)
        self.heads, self.head_dim = heads, head_dim

    def forward(self, x: Tensor) -> Tensor:
        B, n, T, D = x.shape
        flat = x.transpose(1, 2).reshape(B, T, n * D)  # (B, n, T, D) -> (B, T, n·D)
        return super().forward(flat).view(B, T, n, D).transpose(1, 2)  # (B, T, n·D) -> (B, n, T, D)


def make_norm(kind: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """LayerNorm (Ba et al. 2016), RMSNorm (Zhang & Sennrich 2019, LLaMA) or Gemma's RMSNorm with (1 + w),
    over the last dim (of width ``d_model``: a head's D for QK-norm)."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    if kind == "rmsnorm_plus_one":
        return RMSNormPlusOne(d_model, eps=eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """cap · tanh(x / cap): about x where |x| ≪ cap, never past ±cap (Gemma 2's attention and final logits)."""
    return torch.tanh(x / cap) * cap


def check_softcap(name: str, cap) -> None:
    """A soft cap is None (off) or a positive number."""
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        raise ValueError(f"{name} must be a positive number or None, got {cap!r}")
