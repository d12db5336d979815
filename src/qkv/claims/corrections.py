"""The spec's own code beside the right one, as checks: its §2.1 multi-head snippet gives
(n, h, h) scores; its §3.4 "PE check" cannot see position; its FAQ Q2 describes
nn.MultiheadAttention as four nn.Linear (it packs Q, K, V into one weight).

Shapes: n tokens, h heads, d_k head width, C model width.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, SelfAttention
from ..nn.positional import SinusoidalPositionalEncoding
from .measure import FLOAT_TOL, rel_err
from .messages import Term, say
from .registry import check


def spec_mha_scores(mha: MultiHeadAttention, X: Tensor) -> tuple[Tensor, Tensor]:
    """The spec's §2.1 forward, line by line, on mha's weights: (scores, output) for X (n, d_model)."""
    n, d_model = X.size()
    h, d_k = mha.num_heads, d_model // mha.num_heads
    Q = mha.q_proj(X).view(n, h, d_k)  # (n, h, d_k)
    K = mha.k_proj(X).view(n, h, d_k)
    V = mha.v_proj(X).view(n, h, d_k)
    scores = (Q @ K.transpose(-2, -1)) / math.sqrt(d_k)  # (n, h, h): heads attend to heads, per token
    out = torch.softmax(scores, dim=-1) @ V  # (n, h, d_k)
    out = out.transpose(0, 1).contiguous().view(n, d_model)  # (h, n, d_k) -> (n, d_model), rows scrambled
    return scores, mha.out_proj(out)


def correct_mha_scores(mha: MultiHeadAttention, X: Tensor) -> tuple[Tensor, Tensor]:
    """The same with the missing transpose: heads first, so each head attends over tokens."""
    n, d_model = X.size()
    h, d_k = mha.num_heads, d_model // mha.num_heads
    Q = mha.q_proj(X).view(n, h, d_k).transpose(0, 1)  # (n, h, d_k) -> (h, n, d_k)
    K = mha.k_proj(X).view(n, h, d_k).transpose(0, 1)
    V = mha.v_proj(X).view(n, h, d_k).transpose(0, 1)
    scores = (Q @ K.transpose(-2, -1)) / math.sqrt(d_k)  # (h, n, n)
    out = torch.softmax(scores, dim=-1) @ V  # (h, n, d_k)
    out = out.transpose(0, 1).reshape(n, d_model)  # (h, n, d_k) -> (n, h, d_k) -> (n, d_model)
    return scores, mha.out_proj(out)


@check("spec-2.1-scores-shape", "§2.1 (correction)",
       "the spec's §2.1 snippet gives (n, h, h) scores, not (h, n, n); the heads must be moved first",
       claim_zh="原文「scores = (Q @ K.transpose(-2, -1)) / math.sqrt(self.d_k) # (n, h, n)」；"
                "更正：Q、K 的形状是 (n, h, d_k)，这样得到的是 (n, h, h)，须先转置成 (h, n, d_k)")
def spec_scores_shape(mha: nn.Module | None = None, *, n: int = 6, d_model: int = 32, h: int = 4):
    """``mha``: a MultiHeadAttention-like module; its output must match the corrected §2.1 logic."""
    mha = MultiHeadAttention(d_model, h) if mha is None else mha
    X = torch.randn(n, d_model)
    with torch.no_grad():
        spec_s, spec_out = spec_mha_scores(mha, X)
        right_s, right_out = correct_mha_scores(mha, X)
        module_out = mha(X[None])[0]  # (n, d_model): the module under test
    spec_err, right_err = rel_err(spec_out, module_out), rel_err(right_out, module_out)
    holds = (tuple(spec_s.shape) == (n, h, h) and tuple(right_s.shape) == (h, n, n)
             and right_err < FLOAT_TOL and spec_err > 1e-2 and tuple(spec_out.shape) == (n, d_model))
    summary = say("spec-2.1-scores-shape", n=n, h=h, spec=tuple(spec_s.shape), right=tuple(right_s.shape),
                  out=tuple(spec_out.shape), spec_err=spec_err, right_err=right_err)
    measured = {"spec_scores_shape": spec_s.shape, "correct_scores_shape": right_s.shape,
                "spec_output_shape": spec_out.shape, "spec_vs_module": spec_err, "correct_vs_module": right_err}
    return measured, holds, summary


def spec_pe_check(out: Tensor) -> bool:
    """The spec's §3.4 test: torch.allclose(out[[0, 1]], out[[1, 0]]) — rows of ONE output."""
    return torch.allclose(out[[0, 1]], out[[1, 0]])


def permutation_check(f: Callable[[Tensor], Tensor], x: Tensor, perm: list[int]) -> bool:
    """The right test: permute the input; an order-blind f gives the permuted output."""
    return torch.allclose(f(x[perm]), f(x)[perm], atol=FLOAT_TOL)


@check("spec-3.4-pe-check", "§3.4 (correction)",
       "the spec's §3.4 check compares rows of one output and cannot detect position information; "
       "permuting the input can",
       claim_zh="原文「print(torch.allclose(attn_no_pe[[0, 1]], attn_no_pe[[1, 0]])) # True」；"
                "更正：它比较的是同一个输出的两行，看不出位置信息；应当置换输入再比较")
def spec_pe_check_claim(without_pe: Callable | None = None, with_pe: Callable | None = None):
    """``without_pe`` / ``with_pe``: f(x (n, C)) -> (n, C), self-attention without and with PE."""
    d = 16
    tokens = ["狗", "咬", "人"]  # "dog bites man"; reversed, "man bites dog"
    emb = nn.Embedding(len(tokens), d)
    x = emb(torch.arange(len(tokens))).detach()  # (n, d)
    if without_pe is None or with_pe is None:
        sa, pe = SelfAttention(d), SinusoidalPositionalEncoding(d)
        without_pe = sa if without_pe is None else without_pe
        with_pe = (lambda t: sa(t + pe(t.size(0)))) if with_pe is None else with_pe
    reverse = [2, 1, 0]
    with torch.no_grad():
        spec = {"no PE": spec_pe_check(without_pe(x)), "PE": spec_pe_check(with_pe(x))}
        perm = {"no PE": permutation_check(without_pe, x, reverse), "PE": permutation_check(with_pe, x, reverse)}
    holds = spec["no PE"] == spec["PE"] and perm["no PE"] and not perm["PE"]
    summary = say("spec-3.4-pe-check", spec_none=spec["no PE"], spec_pe=spec["PE"], perm_none=perm["no PE"],
                  perm_pe=perm["PE"])
    return {"spec_check": spec, "permutation_test": perm, "spec_expected": {"no PE": True, "PE": False}}, holds, summary


@check("spec-q2-packed-projection", "Q2 (correction)",
       "nn.MultiheadAttention holds one packed in_proj_weight (3d × d) plus out_proj, not four separate nn.Linear",
       claim_zh="原文「PyTorch 的 nn.MultiheadAttention 内部就是用 4 个独立的 nn.Linear（Q / K / V / O 各一个）分别投影」；"
                "更正：它只有一个打包的 in_proj_weight (3d × d) 加 out_proj")
def spec_packed_projection(module: nn.Module | None = None, *, d_model: int = 32, h: int = 4):
    """``module``: expected to be ``nn.MultiheadAttention(d_model, h)``."""
    module = nn.MultiheadAttention(d_model, h, batch_first=True) if module is None else module
    params = {n: list(p.shape) for n, p in module.named_parameters()}
    linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    packed = params.get("in_proj_weight") == [3 * d_model, d_model]
    holds = packed and linears == ["out_proj"]
    measured = {"parameters": params, "linear_submodules": linears, "packed_in_proj": packed}
    if packed:  # same maths: split into four projections, it is qkv's MultiHeadAttention
        from ..interop.torch_nn import mha_from_torch

        x = torch.randn(2, 5, d_model)
        with torch.no_grad():
            split = mha_from_torch(module)(x)  # four projections, same weights
            measured["qkv_split_rel_error"] = rel_err(split, module(x, x, x, need_weights=False)[0])
        holds = holds and measured["qkv_split_rel_error"] < FLOAT_TOL
    split = say("spec-q2-packed-projection/split", err=measured["qkv_split_rel_error"]) if packed else ""
    summary = say("spec-q2-packed-projection", params=", ".join(f"{n} {tuple(s)}" for n, s in params.items()),
                  linears=linears or Term("none"), split=split)
    return measured, holds, summary
