"""FAQ entries that are not a chapter's, as checks: attention scores are not symmetric (Q5);
a token attends to itself (Q16).

Shapes: B batch, T length, C model width, N layers, H heads.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..attention import SelfAttention
from ..models import GPT, ModelConfig
from ..viz.maps import attention_weights
from .measure import FLOAT_TOL
from .registry import check

@check("scores-not-symmetric", "Q5", "attention scores QKᵀ are not symmetric (W_Q and W_K are learned separately)")
def scores_not_symmetric(module: nn.Module | None = None):
    """``module``: SelfAttention-like, with ``q_proj``, ``k_proj`` and ``return_weights=True``."""
    module = SelfAttention(16) if module is None else module
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        _, w = module(x, return_weights=True)  # (1, T, T)
        scores = module.q_proj(x) @ module.k_proj(x).transpose(-2, -1) / math.sqrt(module.q_proj.out_features)
        match = float((torch.softmax(scores, -1) - w).abs().max())  # these are the module's own scores
        asym = float((scores - scores.transpose(-2, -1)).norm() / scores.norm())
    holds = match < FLOAT_TOL and asym > 0.1
    summary = f"‖S − Sᵀ‖/‖S‖ = {asym:.3g}; softmax(S) matches the module's weights to {match:.2g}"
    return {"relative_asymmetry": asym, "weights_match": match}, holds, summary


@check("attends-to-itself", "Q16", "a token attends to itself with non-zero weight")
def attends_to_itself(weights: dict | None = None):
    """``weights``: name -> a function returning (…, T, T) attention weights."""
    if weights is None:
        sa = SelfAttention(16)
        gpt = GPT(ModelConfig(vocab_size=32, d_model=16, num_heads=4, num_layers=2, max_len=16)).eval()
        ids = torch.randint(0, 32, (2, 8))
        weights = {"SelfAttention": lambda: sa(torch.randn(2, 8, 16), return_weights=True)[1],
                   "GPT (causal)": lambda: attention_weights(gpt, ids)}  # (N, B, H, T, T)
    diag = {}
    with torch.no_grad():
        for name, fn in weights.items():
            w = fn()  # (..., T, T)
            d = torch.diagonal(w, dim1=-2, dim2=-1)  # (..., T)
            allowed = (w > 0).sum(-1)  # (..., T): keys each query may see (all, or ≤ itself under a causal mask)
            diag[name] = {"min_self_weight": float(d.min()), "self_over_uniform": float((d * allowed).mean())}
    holds = all(v["min_self_weight"] > 0 for v in diag.values())
    summary = "; ".join(f"{n}: min self-weight {v['min_self_weight']:.3g}, mean {v['self_over_uniform']:.3g}× "
                        "a uniform row's" for n, v in diag.items())
    return diag, holds, summary
