"""Muon: momentum orthogonalised by Newton–Schulz (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/),
with the iteration's precision chosen by the machine.

    B ← μ B + (1 − μ) G                  momentum (kept in fp32)
    U ← G + μ (B − G)  (Nesterov)        or U ← B
    O ← NS⁵(U / ‖U‖)                     ≈ the orthogonal factor of U (quintic Newton–Schulz)
    W ← W (1 − η λ) − η · 0.2 · √max(m, n) · O      ("match_rms_adamw": Liu et al. 2025)

A stack of matrices (E, m, n), a mixture of experts' weights, takes each matrix's step on its own (as
Moonlight trains experts, Liu et al. 2025): its own norm, orthogonal factor and scale.

It is ``torch.optim.Muon``'s algorithm, its state (``momentum_buffer``) and its state dict, but for one thing:
torch runs the Newton–Schulz products in bf16 always, and on a CPU without native bf16 (AVX2, no AVX-512 BF16)
those products are emulated, a hundred times slower than fp32's. Here ``ns_dtype`` says which: bf16 where the
device computes it natively (``qkv.runtime.native_bf16``), fp32 elsewhere (``ns_dtype_for``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic's (a, b, c): torch's and Keller Jordan's
NS_STEPS = 5
EPS = 1e-7


def ns_dtype_for(device: torch.device | str) -> torch.dtype:
    """bf16 where ``device`` computes bf16 products natively, else fp32 (where bf16 would be emulated)."""
    from ..runtime import native_bf16

    return torch.bfloat16 if native_bf16(str(device)) else torch.float32


def newton_schulz(g: Tensor, *, dtype: torch.dtype = torch.bfloat16, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = EPS) -> Tensor:
    """The orthogonal factor of ``g`` (m, n), or of each matrix of a stack (E, m, n), approximately (singular
    values near 1), computed in ``dtype``."""
    a, b, c = coefficients
    stacked = g.dim() == 3
    product = torch.baddbmm if stacked else torch.addmm  # out = β·input + α·(A @ B), per matrix of a stack
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    wide = x.mT if tall else x  # (…, small, large): the Gram matrix is the smaller one
    norm = wide.norm(dim=(-2, -1), keepdim=True) if stacked else wide.norm()
    wide = wide / norm.clamp(min=eps)  # spectral norm ≤ Frobenius norm = 1
    for _ in range(steps):
        gram = wide @ wide.mT  # (…, small, small)
        poly = product(gram, gram, gram, beta=b, alpha=c)  # b A + c A²
        wide = product(wide, poly, wide, beta=a)  # a X + (b A + c A²) X
    return wide.mT if tall else wide


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weights and stacks of them (E, m, n: a mixture's experts, each orthogonalised and scaled as its
    own matrix), its learning rate matched to AdamW's update RMS; ``ns_dtype``: Newton–Schulz's precision
    (None: bf16 where native, fp32 elsewhere — decided for the device of the first weight)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = NS_STEPS, ns_dtype: torch.dtype | None = None) -> None:
        for name, value in (("lr", lr), ("weight_decay", weight_decay), ("momentum", momentum)):
            if not value >= 0:
                raise ValueError(f"Muon's {name} must be >= 0, got {value}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        super().__init__(params, defaults)
        shapes = [tuple(p.shape) for g in self.param_groups for p in g["params"] if p.dim() not in (2, 3)]
        if shapes:
            raise ValueError(f"Muon trains matrices (m, n) and stacks of them (E, m, n) only, got parameters of "
                             f"shape {shapes[:3]}")
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.ns_dtype = ns_dtype or ns_dtype_for(first.device if first is not None else "cpu")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, group)
        return loss

    def update(self, p: Tensor, group: dict) -> None:
        """One weight's step (the module's formulas)."""
        mu, lr = group["momentum"], group["lr"]
        buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
        buf.lerp_(p.grad, 1 - mu)
        u = p.grad.lerp(buf, mu) if group["nesterov"] else buf
        o = newton_schulz(u, dtype=self.ns_dtype, steps=group["ns_steps"])
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(o, alpha=-lr * 0.2 * math.sqrt(max(p.shape[-2:])))
