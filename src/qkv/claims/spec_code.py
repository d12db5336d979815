"""The spec's own code that is right, run beside qkv's: its §1.5 SelfAttention, its §3.2
sinusoid_position_encoding (with its claim that the exp form equals the power form) and its
Q12 mask torch.triu(torch.ones(n, n), diagonal=1). Each is copied as the spec writes it, names
included; the wrong snippets are in ``corrections``.

Shapes: n tokens, d_model width, B batch, T length.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from ..nn.attention import SelfAttention, scaled_dot_product_attention
from ..nn.masks import causal_mask
from ..nn.positional import SinusoidalPositionalEncoding
from .measure import FLOAT_TOL, rel_err
from .messages import Joined, say
from .registry import check


class SpecSelfAttention(nn.Module):
    """The spec's §1.5 class, verbatim."""

    def __init__(self, d_model):
        super().__init__()
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)

    def forward(self, X):
        Q = self.W_Q(X)
        K = self.W_K(X)
        V = self.W_V(X)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        attn = torch.softmax(scores, dim=-1)
        return attn @ V


@check("spec-1.5-self-attention", "§1.5",
       "the spec's minimal SelfAttention class computes what qkv.SelfAttention computes",
       claim_zh="「这段代码就是 Transformer 论文里 Attention 公式的逐行翻译」")
def spec_self_attention(module: nn.Module | None = None, *, n: int = 4, d_model: int = 8):
    """``module``: SelfAttention-like (``q_proj``, ``k_proj``, ``v_proj``); the spec's class gets its weights."""
    module = SelfAttention(d_model) if module is None else module
    spec = SpecSelfAttention(d_model)
    spec.load_state_dict({"W_Q.weight": module.q_proj.weight, "W_K.weight": module.k_proj.weight,
                          "W_V.weight": module.v_proj.weight})
    X = torch.randn(n, d_model)  # (n, d_model), the spec's example: n=4 tokens of 8 dimensions
    with torch.no_grad():
        err = rel_err(module(X), spec(X))
    holds = err < FLOAT_TOL
    summary = say("spec-1.5-self-attention", n=n, d_model=d_model, err=err)
    return {"rel_error": err}, holds, summary


def sinusoid_position_encoding(n, d_model, dtype=torch.float32):
    """The spec's §3.2 function, verbatim but for ``dtype``."""
    pe = torch.zeros(n, d_model, dtype=dtype)
    pos = torch.arange(0, n).to(dtype).unsqueeze(1)  # (n, 1)
    div = torch.exp(torch.arange(0, d_model, 2).to(dtype) * (-math.log(10000.0) / d_model))  # (d_model/2,)
    pe[:, 0::2] = torch.sin(pos * div)  # even dimensions
    pe[:, 1::2] = torch.cos(pos * div)  # odd dimensions
    return pe


def power_form(n: int, d_model: int, dtype=torch.float64) -> Tensor:
    """PE straight from the formula, pos / 10000^(2i/d_model), no exp: (n, d_model)."""
    pos = torch.arange(n, dtype=dtype)[:, None]  # (n, 1)
    angle = pos / torch.tensor(10000.0, dtype=dtype) ** (torch.arange(0, d_model, 2, dtype=dtype) / d_model)
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)  # (n, d/2, 2) -> (n, d): sin, cos, …


@check("spec-3.2-sinusoidal", "§3.2",
       "the spec's sinusoid_position_encoding equals the formula (exp(2i·(−log 10000)/d) for 10000^(−2i/d)) and "
       "qkv's PE, up to float rounding",
       claim_zh="「把 10000^{2i / d_model} 写成 exp(2i * (-log(10000) / d_model))，避免显式调用指数运算，结果完全一致」")
def spec_sinusoidal(pe: Callable | None = None, *, lengths=(512, 4096), d_model: int = 128):
    """``pe(n)`` -> (n, d_model), fp32. Error in fp32 grows with position (rounding of pos·ω); fp64 shows the maths."""
    pe = SinusoidalPositionalEncoding(d_model) if pe is None else pe
    err = {}
    for n in lengths:
        exact = power_form(n, d_model)
        err[n] = {"spec_fp64": float((sinusoid_position_encoding(n, d_model, torch.float64) - exact).abs().max()),
                  "spec_fp32": float((sinusoid_position_encoding(n, d_model).double() - exact).abs().max()),
                  "qkv_fp32": float((pe(n).double() - exact).abs().max())}
    rounding = {n: n * 2.0**-23 for n in lengths}  # fp32 spacing of an angle up to n radians
    holds = all(e["spec_fp64"] < 1e-9 and e["spec_fp32"] < 4 * rounding[n] and e["qkv_fp32"] < 4 * rounding[n]
                for n, e in err.items())
    summary = say("spec-3.2-sinusoidal", lengths=Joined([say("spec-3.2-sinusoidal/length", n=n, fp64=e["spec_fp64"],
                                                           fp32=e["spec_fp32"], qkv=e["qkv_fp32"])
                                                       for n, e in err.items()]))
    return {"d_model": d_model, "max_error": err}, holds, summary


def spec_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Q12 as the spec writes it: torch.triu(torch.ones(n, n), diagonal=1) set to −∞ before the softmax."""
    n = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., n, n)
    scores = scores.masked_fill(torch.triu(torch.ones(n, n), diagonal=1).bool(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@check("spec-q12-triu-mask", "Q12",
       "the spec's triu(ones(n, n), diagonal=1) mask does what is_causal=True does; the diagonal stays, so a "
       "token sees itself and the past",
       claim_zh="「实现上常用 torch.triu(torch.ones(n, n), diagonal=1) 生成掩码」「也可以直接用 PyTorch 的 is_causal=True "
                "参数触发相同行为」")
def spec_triu_mask(masked: Callable = spec_causal_attention, *, n: int = 7):
    """``masked(q, k, v)`` -> out: the spec's way, against is_causal=True and qkv.causal_mask."""
    q, k, v = torch.randn(2, n, 8), torch.randn(2, n, 8), torch.randn(2, n, 8)  # (B, T, D)
    spec = masked(q, k, v)
    err = {"is_causal": rel_err(spec, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
           "qkv.causal_mask": rel_err(spec, scaled_dot_product_attention(q, k, v, mask=causal_mask(n)))}
    first = rel_err(spec[:, 0], v[:, 0])  # token 0 sees only itself: its output is its own value
    holds = max(err.values()) < FLOAT_TOL and first < FLOAT_TOL
    summary = say("spec-q12-triu-mask", n=n, causal=err["is_causal"], mask=err["qkv.causal_mask"], first=first)
    return {"rel_error": err, "first_token_is_own_value": first}, holds, summary
