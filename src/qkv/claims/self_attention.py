"""Chapter 1, self-attention, as checks: Q, K, V from three learned projections and an (n, n)
score matrix (§1.1, §1.2); the 1/√d_k scaling (§1.3), which PyTorch's fused attention applies
by default (§1.3 tip); attention weights as probability distributions (§1.4 / Q17), outputs as
convex combinations of V's rows (§1.4) and of the input's shape (Q18).

Each check's core takes the function or module under test (qkv's by default), so a test can
hand it a broken one and watch it fail.

Shapes: B batch, T length, C model width, H heads, D head width, L/S query/key length.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from .measure import FLOAT_TOL, fmt, rel_err
from .messages import Joined, say
from .registry import check


# --- §1.3: scaling by 1/√d_k ---------------------------------------------------------------
SCALING_D_K = (16, 64, 256)


def unit_qk(d_k: int, *, batch: int = 16, n: int = 64) -> tuple[Tensor, Tensor]:
    """q, k (batch, n, d_k) with independent N(0, 1) entries: the spec's assumption in §1.3."""
    return torch.randn(batch, n, d_k), torch.randn(batch, n, d_k)


def softmax_stats(attention: Callable, q: Tensor, k: Tensor, *, scale: float | None = None) -> dict:
    """What the softmax inside ``attention`` sees and gives, measured through the function itself.

    With V = I the output *is* the weight matrix, and a zero ``bias`` added to the scores has
    ∂L/∂bias = ∂L/∂scores: the gradient that reaches the scores through the softmax.
    Returns the softmax-input variance (per row, recovered as the variance of log-weights),
    the mean max weight, mean entropy (nats), the fraction of rows with max weight > 0.9,
    and the median per-row norm of ∂L/∂scores for a random upstream gradient.
    """
    B, L, S = q.size(0), q.size(1), k.size(1)
    v = torch.eye(S).expand(B, S, S)  # (B, S, S): out = weights @ I = weights
    bias = torch.zeros(B, L, S, requires_grad=True)
    w = attention(q, k, v, bias=bias, scale=scale)  # (B, L, S)
    (w * torch.randn(B, L, S)).sum().backward()
    w = w.detach()
    logw = w.log()  # = scores − logsumexp(row): same within-row variance as the scores
    input_var = float(logw.var(-1).mean()) if torch.isfinite(logw).all() else math.inf  # a 0 weight: underflow
    return {
        "softmax_input_var": input_var,
        "max_weight": float(w.max(-1).values.mean()),
        "entropy": float(-(w * w.clamp_min(1e-30).log()).sum(-1).mean()),
        "saturated_rows": float((w.max(-1).values > 0.9).float().mean()),
        "grad_median": float(bias.grad.norm(dim=-1).median()),
    }


@check("scaling-variance", "§1.3",
       "QKᵀ score variance grows in proportion to d_k; after dividing by √d_k it stays near 1",
       claim_zh="「假设 Q、K 的每个分量都是均值 0、方差 1 的独立随机变量，那么 Q·K 的方差就是 d_k」"
                "「论文作者通过 √d_k 这一缩放，让 softmax 的输入方差稳定在 1 附近」")
def scaling_variance(attention: Callable = scaled_dot_product_attention, *, d_ks=SCALING_D_K):
    """``attention``: a function with qkv.scaled_dot_product_attention's signature (needs ``bias=``, ``scale=``)."""
    raw, scaled = [], []
    for d_k in d_ks:
        q, k = unit_qk(d_k)
        raw.append(float((q @ k.transpose(-2, -1)).var()) / d_k)  # (B, n, n) raw scores, spec §1.2
        scaled.append(softmax_stats(attention, q, k)["softmax_input_var"])
    holds = all(abs(r - 1) < 0.1 for r in raw) and all(abs(s - 1) < 0.1 for s in scaled)
    summary = say("scaling-variance", raw=fmt(raw), scaled=fmt(scaled), d_ks=fmt(d_ks))
    return {"d_k": d_ks, "raw_var_over_d_k": raw, "scaled_var": scaled}, holds, summary


@check("scaling-saturation", "§1.3",
       "without the √d_k scaling softmax saturates: near one-hot rows, vanishing gradient",
       claim_zh="「softmax 的输出会极度趋近于 one-hot 分布——也就是\"只把注意力压在一个位置上\"，梯度极小」")
def scaling_saturation(attention: Callable = scaled_dot_product_attention, *, d_ks=SCALING_D_K):
    """Each statistic through ``attention`` with its default scale and with ``scale=1.0``, q, k ~ N(0, 1)."""
    runs = {"scaled": [], "unscaled": []}
    for d_k in d_ks:
        q, k = unit_qk(d_k)
        runs["scaled"].append(softmax_stats(attention, q, k))
        runs["unscaled"].append(softmax_stats(attention, q, k, scale=1.0))
    m = {way: {key: [s[key] for s in stats] for key in ("max_weight", "entropy", "saturated_rows", "grad_median")}
         for way, stats in runs.items()}
    s, u = m["scaled"], m["unscaled"]

    def steady(xs):  # within ±15 % across d_k
        return max(xs) <= 1.15 * min(xs)

    holds = (
        steady(s["max_weight"]) and steady(s["entropy"]) and steady(s["grad_median"])
        and u["max_weight"] == sorted(u["max_weight"]) and u["max_weight"][-1] > 0.5
        and u["grad_median"][-1] < 0.2 * s["grad_median"][-1]
    )
    summary = say("scaling-saturation", d_ks=fmt(d_ks), s_max=fmt(s["max_weight"]), u_max=fmt(u["max_weight"]),
                  s_ent=fmt(s["entropy"]), u_ent=fmt(u["entropy"]), s_grad=fmt(s["grad_median"]),
                  u_grad=fmt(u["grad_median"]))
    return {"d_k": d_ks, **m}, holds, summary


@check("sdpa-default-scale", "§1.3 tip",
       "PyTorch's F.scaled_dot_product_attention divides by √d_k by default",
       claim_zh="「PyTorch 的 torch.nn.functional.scaled_dot_product_attention 内部默认就包含这一缩放」")
def sdpa_default_scale(sdpa: Callable = F.scaled_dot_product_attention, *, d_k: int = 64):
    """``sdpa(q, k, v)`` with its defaults, against softmax(QKᵀ/√d_k)V and softmax(QKᵀ)V written out."""
    q, k, v = torch.randn(2, 10, d_k), torch.randn(2, 10, d_k), torch.randn(2, 10, d_k)  # (B, T, D)
    out = sdpa(q, k, v)
    scaled = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), -1) @ v
    unscaled = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
    err = {"scaled": rel_err(out, scaled), "unscaled": rel_err(out, unscaled)}
    holds = err["scaled"] < FLOAT_TOL and err["unscaled"] > 1e-2
    summary = say("sdpa-default-scale", d_k=d_k, scaled=err["scaled"], unscaled=err["unscaled"])
    return err, holds, summary


# --- §1.1 / §1.2: Q, K, V and the score matrix ---------------------------------------------
@check("qkv-projections", "§1.1 / §1.2",
       "Q, K, V come from X through three learned d_model × d_model matrices; QKᵀ is an (n, n) score matrix",
       claim_zh="「Q / K / V 三个矩阵都由 X 乘以三个可学习的权重矩阵得到」「得到的 scores 矩阵（n×n）就是\"注意力分数矩阵\"」")
def qkv_projections(module: nn.Module | None = None, *, n: int = 4, d_model: int = 8):
    """``module``: SelfAttention-like with ``q_proj``, ``k_proj``, ``v_proj`` and ``return_weights=True``."""
    module = SelfAttention(d_model) if module is None else module
    projections = [module.q_proj, module.k_proj, module.v_proj]
    X = torch.randn(n, d_model)  # (n, d_model): the spec's 4 tokens of 8 dimensions
    out, w = module(X, return_weights=True)  # (n, d_model), (n, n)
    weights = [p.weight for p in projections]
    grads = torch.autograd.grad(out.square().sum(), [p for p in weights if p.requires_grad], allow_unused=True)
    learned = [g is not None and bool(g.abs().sum() > 0) for g in grads] + [False] * (3 - len(grads))
    shapes = [list(p.shape) for p in weights]
    biases = [p.bias is not None for p in projections]
    holds = (shapes == [[d_model, d_model]] * 3 and all(learned) and not any(biases)
             and list(w.shape) == [n, n])
    summary = say("qkv-projections", n=n, d_model=d_model, shapes=", ".join(map(str, map(tuple, shapes))),
                  bias=any(biases), learned=all(learned), weights=tuple(w.shape))
    return {"weight_shapes": shapes, "learned": learned, "bias": biases, "weights_shape": list(w.shape)}, holds, summary


# --- §1.4 / Q17 / Q18: what attention computes ---------------------------------------------
@check("softmax-rows", "§1.4 / Q17",
       "each row of attention weights is a probability distribution (non-negative, sums to 1)",
       claim_zh="「把分数做 softmax 归一化（让每行变成 0~1 的概率分布）」「是，每行（即每个 Query）的权重和为 1」")
def softmax_rows(attention: Callable = scaled_dot_product_attention):
    """``attention`` returns (out, weights) with ``return_weights=True``; plain, causal and padded cases."""
    q, k, v = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 5)  # (B, H, L|S, D)
    valid = torch.arange(9) < torch.tensor([9, 4])[:, None]  # (B, S): the second sequence has 4 real keys
    cases = {"plain": {}, "causal": {"is_causal": True}, "padding": {"mask": valid[:, None, None, :]}}
    min_w, max_dev = {}, {}
    for name, kw in cases.items():
        _, w = attention(q, k, v, return_weights=True, **kw)  # (B, H, L, S)
        min_w[name], max_dev[name] = float(w.min()), float((w.sum(-1) - 1).abs().max())
    holds = min(min_w.values()) >= 0 and max(max_dev.values()) < FLOAT_TOL
    summary = say("softmax-rows", min_w=min(min_w.values()), dev=max(max_dev.values()))
    return {"min_weight": min_w, "max_row_sum_error": max_dev}, holds, summary


@check("convex-combination", "§1.4", "each output row is a convex combination of the rows of V",
       claim_zh="「再用相关程度当权重对 V 做加权平均」")
def convex_combination(module: nn.Module | None = None):
    """``module``: SelfAttention-like, with ``v_proj`` and ``return_weights=True``."""
    module = SelfAttention(16) if module is None else module
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        out, w = module(x, return_weights=True)  # (B, T, C), (B, T, T)
        v = module.v_proj(x)  # (B, T, C)
    recon = float((out - w @ v).abs().max())
    row_dev = float((w.sum(-1) - 1).abs().max())
    # A convex combination stays inside the per-coordinate range of the rows it mixes.
    outside = float(torch.maximum(out - v.amax(-2, keepdim=True), v.amin(-2, keepdim=True) - out).clamp_min(0).max())
    holds = float(w.min()) >= 0 and row_dev < FLOAT_TOL and recon < FLOAT_TOL and outside < FLOAT_TOL
    summary = say("convex-combination", recon=recon, min_w=float(w.min()), dev=row_dev, outside=outside)
    return {"max_reconstruction_error": recon, "min_weight": float(w.min()), "max_row_sum_error": row_dev,
            "max_outside_value_range": outside}, holds, summary


@check("output-shape", "Q18", "the attention output has the input's shape",
       claim_zh="「和输入维度一致，都是 (n, d_model)」")
def output_shape(modules: dict | None = None):
    """``modules``: name -> (module, input shapes)."""
    if modules is None:
        modules = {"SelfAttention": (SelfAttention(16), [(5, 16), (2, 5, 16), (2, 3, 5, 16)]),
                   "MultiHeadAttention": (MultiHeadAttention(16, 4), [(1, 5, 16), (3, 7, 16)])}
    pairs = {}
    with torch.no_grad():
        for name, (module, shapes) in modules.items():
            pairs[name] = [[list(s), list(module(torch.randn(*s)).shape)] for s in shapes]
    holds = all(i == o for ps in pairs.values() for i, o in ps)
    summary = Joined([say("output-shape/module", name=n, pairs=", ".join(f"{tuple(i)}→{tuple(o)}" for i, o in ps))
                      for n, ps in pairs.items()])
    return {"input_output_shapes": pairs}, holds, summary
