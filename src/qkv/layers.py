"""Position-wise feed-forward networks and normalisation layers.

Shapes: B batch, T length, C model width, F feed-forward width.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .linear import Linear

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form (BERT, the original Transformer's successors)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
}
GATED = {"swiglu": F.silu, "geglu": F.gelu}  # Shazeer 2020, "GLU variants improve Transformer"
NORMS = ("layernorm", "rmsnorm")


class FeedForward(nn.Module):
    """FFN(x) = W_down · act(W_up x)  (Vaswani et al. §3.3), or gated: W_down · (act(W_gate x) ⊙ W_up x).

    ``activation``: relu | gelu | gelu_tanh | silu, or the gated swiglu | geglu (LLaMA uses swiglu).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS and activation not in GATED:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS) + sorted(GATED)}, got {activation!r}")
        for name, value in (("d_model", d_model), ("d_ff", d_ff)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.activation = activation
        self.act = GATED.get(activation) or ACTIVATIONS[activation]
        self.up_proj = Linear(d_model, d_ff, bias=bias)
        self.gate_proj = Linear(d_model, d_ff, bias=bias) if activation in GATED else None
        self.down_proj = Linear(d_ff, d_model, bias=bias)
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
