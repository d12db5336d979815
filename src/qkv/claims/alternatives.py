"""Other ways to attend, beside the spec's, as checks: ReLU instead of softmax (Q1), a fixed
window that is a convolution (Q14), additive (Bahdanau) scoring instead of the dot product (Q19).

Shapes: B batch, H heads, L query length, S key length, T length, C width, D head width,
A additive attention's hidden width.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn.attention import scaled_dot_product_attention
from ..runtime import fixed_threads, resolve_device
from .measure import FLOAT_TOL, cost, fmt, rel_err
from .messages import Joined, say
from .registry import check


# --- Q1: softmax and its alternatives ------------------------------------------------------
def row_stats(weights: Tensor) -> dict:
    """Row sums (mean, std), the smallest weight and the fraction of exact zeros of (..., L, S) weights."""
    sums = weights.sum(-1)
    return {"row_sum_mean": float(sums.mean()), "row_sum_std": float(sums.std()), "min": float(weights.min()),
            "zero_fraction": float((weights == 0).float().mean())}


def is_distribution(stats: dict) -> bool:
    return abs(stats["row_sum_mean"] - 1) < FLOAT_TOL and stats["row_sum_std"] < FLOAT_TOL and stats["min"] > 0


@check("softmax-vs-relu", "Q1",
       "on the same scores softmax rows are distributions (sum 1, all > 0) and ReLU rows are not (sums vary, "
       "many exact zeros)",
       claim_zh="「softmax 的优势是输出可解释为概率分布，所有权重非负且和为 1」「也有工作研究用 ReLU 等替代」")
def softmax_vs_relu(normalise: Callable = lambda s: torch.softmax(s, -1), alternative: Callable = torch.relu):
    """``normalise`` / ``alternative``: scores (…, L, S) -> weights; the first must give distributions."""
    q, k = torch.randn(4, 4, 32, 16), torch.randn(4, 4, 32, 16)  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16)  # (B, H, L, S), as in the spec's §1.4
    stats = {"softmax": row_stats(normalise(scores)), "relu": row_stats(alternative(scores))}
    holds = is_distribution(stats["softmax"]) and not is_distribution(stats["relu"])
    summary = Joined([say("softmax-vs-relu/way", name=k, mean=v["row_sum_mean"], std=v["row_sum_std"], least=v["min"],
                          zeros=100 * v["zero_fraction"]) for k, v in stats.items()])
    return stats, holds, summary


# --- Q14: attention over a fixed window is a convolution -----------------------------------
def window_bias(n: int, kernel: Tensor) -> Tensor:
    """Scores that depend on position only: log kernel[j − i + r] within |j − i| ≤ r, −inf beyond. (T, T)."""
    r = kernel.numel() // 2
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # (T, T): j − i
    inside = offset.abs() <= r
    return torch.where(inside, kernel.log()[(offset + r).clamp(0, 2 * r)], torch.tensor(-math.inf))


@check("window-is-convolution", "Q14",
       "attention restricted to a k-neighbourhood with fixed, position-only weights is a convolution",
       claim_zh="「把注意力范围限制到局部 k 邻域、并固定权重时，Self-Attention 的形式与 CNN 在数学上接近」")
def window_is_convolution(attention: Callable = scaled_dot_product_attention, *, n: int = 32, c: int = 8,
                          r: int = 2):
    """``attention``: qkv.scaled_dot_product_attention's signature (``bias=``). Zero queries and keys leave
    softmax(bias): weights kernel[j − i + r] / (the kernel's mass inside the sequence)."""
    kernel = torch.softmax(torch.randn(2 * r + 1), -1)  # (2r+1,), positive, sums to 1
    v = torch.randn(1, n, c)  # (B, T, C)
    zeros = torch.zeros(1, n, 4)  # q = k = 0: scores are the bias alone
    fixed = attention(zeros, zeros, v, bias=window_bias(n, kernel))  # (B, T, C)
    channels = v.transpose(1, 2).reshape(c, 1, n)  # (B, T, C) -> (C, 1, T): one channel per row
    conv = F.conv1d(channels, kernel.view(1, 1, -1), padding=r)  # Σ_m kernel[m] v[i + m − r], as a CNN computes
    mass = F.conv1d(torch.ones(1, 1, n), kernel.view(1, 1, -1), padding=r)  # (1, 1, T): 1 but at the edges
    expected = (conv / mass).reshape(1, c, n).transpose(1, 2)  # (B, T, C); interior rows: mass 1
    dynamic = attention(torch.randn(1, n, 4), torch.randn(1, n, 4), v, bias=window_bias(n, kernel))
    err, err_dynamic = rel_err(fixed, expected), rel_err(dynamic, expected)
    holds = err < FLOAT_TOL and err_dynamic > 1e-2
    summary = say("window-is-convolution", n=n, r=r, err=err, dynamic=err_dynamic)
    return {"conv_rel_error": err, "dynamic_rel_error": err_dynamic, "window": 2 * r + 1}, holds, summary


# --- Q19: additive against dot-product scoring ---------------------------------------------
def additive_scores(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, v_a: Tensor) -> Tensor:
    """Bahdanau et al. 2015: score_ij = v_aᵀ tanh(W_q q_i + W_k k_j).

    q (L, D), k (S, D), w_q and w_k (A, D), v_a (A,) -> scores (L, S).
    """
    hidden = torch.tanh((q @ w_q.T)[:, None, :] + (k @ w_k.T)[None, :, :])  # (L, 1, A) + (1, S, A) -> (L, S, A)
    return (hidden @ v_a[:, None]).squeeze(-1)  # (L, S, A) @ (A, 1) -> (L, S, 1) -> (L, S)


def dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """score_ij = q_i · k_j / √D: (L, D), (S, D) -> (L, S)."""
    return q @ k.T / math.sqrt(q.size(-1))


def scoring_cost(additive: Callable, dot: Callable, n: int, d: int) -> dict:
    """FLOPs (matrix products), element-wise operations and the largest tensor of each scoring, at A = D (meta)."""
    q, k = torch.empty(n, d, device="meta"), torch.empty(n, d, device="meta")
    w, v_a = torch.empty(d, d, device="meta"), torch.empty(d, device="meta")
    flops_a, big_a = cost(lambda: additive(q, k, w, w, v_a))
    flops_d, big_d = cost(lambda: dot(q, k))
    return {"additive": {"flops": flops_a["Global"], "elementwise": 2 * n * n * d, "largest_bytes": big_a},
            "dot": {"flops": flops_d["Global"], "elementwise": n * n, "largest_bytes": big_d}}


@check("additive-vs-dot", "Q19",
       "additive and dot-product scoring have similar complexity, O(L·S·d), but additive holds an (L, S, d) "
       "tensor where the dot product holds (L, S)",
       claim_zh="「两者在理论复杂度上相似，但 Dot-Product \"is much faster and more space-efficient in practice」")
def additive_vs_dot(additive: Callable = additive_scores, dot: Callable = dot_scores, *, n: int = 256,
                    d: int = 64):
    """``additive(q, k, w_q, w_k, v_a)`` and ``dot(q, k)`` -> (L, S) scores; counted on meta tensors."""
    c = scoring_cost(additive, dot, n, d)
    a, p = c["additive"], c["dot"]
    ops_ratio = (a["flops"] + a["elementwise"]) / (p["flops"] + p["elementwise"])
    memory_ratio = a["largest_bytes"] / p["largest_bytes"]
    holds = ops_ratio < 4 and memory_ratio >= d
    summary = say("additive-vs-dot", n=n, d=d, a_flops=a["flops"] / 1e6, a_ops=a["elementwise"] / 1e6,
                  d_flops=p["flops"] / 1e6, ratio=ops_ratio, a_mb=a["largest_bytes"] / 2**20,
                  d_mb=p["largest_bytes"] / 2**20, memory=memory_ratio)
    return {"n": n, "d": d, **c, "ops_ratio": ops_ratio, "memory_ratio": memory_ratio}, holds, summary


def median_seconds(fn: Callable[[], object], *, repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@check("additive-vs-dot-measured", "Q19",
       "measured: dot-product scoring is faster than additive scoring at equal width, at every length",
       claim_zh="「Dot-Product \"is much faster and more space-efficient in practice, since it can be implemented "
                "using highly optimized matrix multiplication code\"——因为矩阵乘可以通过高度优化的 BLAS / cuBLAS 实现」",
       full=True)
def additive_vs_dot_measured(additive: Callable = additive_scores, dot: Callable = dot_scores, *,
                             lengths=(128, 512, 2048), d: int = 64):
    """Median time of each scoring on real tensors; the memory side is ``additive-vs-dot``'s count."""
    device, ms = resolve_device("auto"), {"additive": [], "dot": []}
    with fixed_threads(None), torch.inference_mode():
        for n in lengths:
            q, k, w, v_a = (torch.randn(*s, device=device) for s in ((n, d), (n, d), (d, d), (d,)))
            ms["additive"].append(1e3 * median_seconds(lambda: additive(q, k, w, w, v_a)))
            ms["dot"].append(1e3 * median_seconds(lambda: dot(q, k)))
    speedup = [a / b for a, b in zip(ms["additive"], ms["dot"])]
    holds = min(speedup) > 1
    summary = say("additive-vs-dot-measured", d=d, lengths=fmt(lengths), device=device.type,
                  additive=fmt(ms["additive"]), dot=fmt(ms["dot"]), speedup=fmt(speedup))
    return {"lengths": lengths, "milliseconds": ms, "speedup": speedup, "device": device.type}, holds, summary
