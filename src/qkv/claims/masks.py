"""Chapter 4's masks as checks: under a causal mask no information flows from the future (Q12),
measured as a zero gradient of each output on every later input.

Shapes: B batch, T length, C model width.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ..nn.attention import MultiHeadAttention
from ..models import GPT, ModelConfig
from .messages import Joined, Term, say
from .registry import check


def future_gradient(f: Callable[[Tensor], Tensor], x: Tensor) -> tuple[float, float]:
    """(max |∂f(x)_t / ∂x_s| over s > t, min over t of ‖∂f(x)_t / ∂x_{≤t}‖) for x (1, T, C)."""
    future, past = 0.0, math.inf
    for t in range(x.size(1)):
        xi = x.detach().clone().requires_grad_(True)
        f(xi)[0, t].sum().backward()
        future = max(future, float(xi.grad[0, t + 1:].abs().max()) if t + 1 < x.size(1) else 0.0)
        past = min(past, float(xi.grad[0, : t + 1].norm()))
    return future, past


def _gpt_on_embeddings(model: GPT, ids: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """(f, e): the GPT's embedding output e (B, T, C) for ids, and f(e') = its logits with e' in place of e."""
    seen = []
    handle = model.embed.register_forward_hook(lambda m, inputs, out: seen.append(out.detach()))
    with torch.no_grad():
        model(ids)
    handle.remove()

    def f(e: Tensor) -> Tensor:
        handle = model.embed.register_forward_hook(lambda m, inputs, out: e)
        try:
            return model(ids).logits
        finally:
            handle.remove()

    return f, seen[0]


@check("causal-no-future", "Q12", "a causal mask lets no information flow from the future (zero gradient)",
       claim_zh="「Decoder 用 Causal Self-Attention（因果自注意力），保证预测时不偷看未来」")
def causal_no_future(causal: dict | None = None):
    """``causal``: name -> (f, x) with x (1, T, C); output t must not depend on inputs after t."""
    if causal is None:
        mha = MultiHeadAttention(16, 4)
        gpt = GPT(ModelConfig(vocab_size=32, d_model=16, attention=dict(num_heads=4), num_layers=2, max_len=16)).eval()
        ids = torch.randint(0, 32, (1, 8))
        causal = {
            "MHA (fused)": (lambda x: mha(x, is_causal=True), torch.randn(1, 8, 16)),
            "MHA (reference)": (lambda x: mha(x, is_causal=True, return_weights=True)[0], torch.randn(1, 8, 16)),
            "GPT": _gpt_on_embeddings(gpt, ids),
        }
    grads = {name: future_gradient(f, x) for name, (f, x) in causal.items()}
    holds = all(fut == 0.0 and past > 0 for fut, past in grads.values())
    summary = Joined([say("causal-no-future/module", name=Term(n), future=fut, past=past)
                      for n, (fut, past) in grads.items()])
    return {n: {"max_future_grad": fut, "min_past_grad_norm": past} for n, (fut, past) in grads.items()}, holds, summary
