"""FAQ Q4, the cost of self-attention against sequence length n, as checks.

What "O(n²·d_model)" counts: the scores QKᵀ (2·n²·d FLOPs) and the weighted sum W·V (2·n²·d),
4·n²·d in all, and the (n, n) weights per head that the reference path holds. The four
projections cost 8·n·d² (O(n·d²)): they dominate until 4·n²·d = 8·n·d², n = 2·d (1024 at
d_model = 512). The fast checks count FLOPs with FlopCounterMode on meta tensors (shapes only,
nothing computed); the heavy one (``full``) times real calls, through ``benchmarks.complexity``
in a source checkout, else a small built-in measurement.

Shapes: B batch, H heads, n length, D head width, C model width.
"""
from __future__ import annotations

import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from ..nn.attention import MultiHeadAttention, scaled_dot_product_attention
from ..nn.flash import flash_attention
from ..nn.linear_attention import linear_attention
from ..runtime import fixed_threads, resolve_device
from .measure import cost, fit_exponent, fmt
from .messages import Joined, Term, say
from .registry import check

LENGTHS = (256, 512, 1024, 2048)
FULL_LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
PATHS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {  # q, k, v (B, H, n, D) -> (B, H, n, D)
    "reference": lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)[0],
    "fused": lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True),
    "flash": lambda q, k, v: flash_attention(q, k, v, is_causal=True),
    "linear": lambda q, k, v: linear_attention(q, k, v, is_causal=True),
}


# The ops that multiply by a weight matrix (F.linear's, and the speed layer's should a model be accelerated),
# whichever module calls them: nn.MultiheadAttention projects in its own forward.
PRODUCTS_WITH_WEIGHTS = {"aten.mm", "aten.addmm", "aten.linear", "mkldnn._linear_pointwise", "qkv.onednn_linear",
                         "qkv.matvec"}


def mha_cost(make: Callable, n: int, *, d_model: int, heads: int) -> dict:
    """FLOPs of the projections and of the attention proper, and the largest tensor, of one reference-path
    forward of ``make(d_model, heads)`` on (1, n, C) meta tensors."""
    with torch.device("meta"):
        module, x = make(d_model, heads), torch.empty(1, n, d_model)  # (B, n, C)
    flops, largest = cost(lambda: module(x, return_weights=True), by="op")
    projections = sum(f for op, f in flops.items() if op in PRODUCTS_WITH_WEIGHTS)  # q, k, v and out, however packed
    return {"projections": projections, "attention": flops["Global"] - projections, "largest_bytes": largest}


@check("attention-quadratic", "Q4",
       "self-attention costs O(n²·d_model): scores and weighted sum take 4·n²·d FLOPs and (n, n) weights per "
       "head; the projections (8·n·d², O(n·d²)) dominate until n = 2·d_model",
       claim_zh="「O(n² · d_model)，其中 n 是序列长度」「Self-Attention 的时间和空间复杂度是序列长度的平方级」")
def attention_quadratic(make: Callable = MultiHeadAttention, *, d_model: int = 512, heads: int = 8,
                        lengths=LENGTHS):
    """``make(d_model, heads)``: a MultiHeadAttention-like module with ``return_weights`` and ``*_proj`` linears."""
    costs = [mha_cost(make, n, d_model=d_model, heads=heads) for n in lengths]
    series = {key: [c[key] for c in costs] for key in ("attention", "projections", "largest_bytes")}
    slopes = {key: fit_exponent(lengths, ys) for key, ys in series.items()}
    at = mha_cost(make, 2 * d_model, d_model=d_model, heads=heads)  # the crossover, 4n²d = 8nd² at n = 2d
    formula = [4 * n * n * d_model for n in lengths]
    holds = (abs(slopes["attention"] - 2) < 0.05 and abs(slopes["largest_bytes"] - 2) < 0.05
             and abs(slopes["projections"] - 1) < 0.05 and at["attention"] == at["projections"])
    summary = say("attention-quadratic", d_model=d_model, lengths=fmt(lengths),
                  attention=fmt(f / 1e9 for f in series["attention"]), exact=series["attention"] == formula,
                  e_attention=slopes["attention"], largest=fmt(b / 2**20 for b in series["largest_bytes"]),
                  e_largest=slopes["largest_bytes"], e_projections=slopes["projections"], crossover=2 * d_model,
                  at=at["attention"] / 1e9)
    measured = {"d_model": d_model, "lengths": lengths, **series, "exponents": slopes,
                "crossover_n": 2 * d_model, "at_crossover": at}
    return measured, holds, summary


def exponents(slopes: dict[str, dict[str, float]], first: str, second: str) -> Joined:
    """'reference 2.00 / 2.00; flash 2.00 / 1.00; …': two fitted exponents per path, path names translated."""
    return Joined([say("exponents/path", name=Term(p), first=s[first], second=s[second]) for p, s in slopes.items()])


def answer_cost(attend: Callable, n: int, *, heads: int = 8, head_dim: int = 64) -> tuple[int, int]:
    """(FLOPs, largest tensor bytes) of attend(q, k, v) on (1, H, n, D) meta tensors."""
    q, k, v = (torch.empty(1, heads, n, head_dim, device="meta") for _ in range(3))  # (B, H, n, D)
    flops, largest = cost(lambda: attend(q, k, v))
    return flops["Global"], largest


ANSWERS = {  # bidirectional (an encoder's attention): the cleanest exponents
    "reference": lambda q, k, v: scaled_dot_product_attention(q, k, v, return_weights=True),
    "flash": lambda q, k, v: flash_attention(q, k, v, block_size=128),
    "linear": lambda q, k, v: linear_attention(q, k, v),
}


@check("attention-quadratic-answers", "Q4",
       "FlashAttention and linear attention answer the n²: flash holds O(n) memory (its FLOPs stay O(n²)), "
       "linear attention is O(n) in FLOPs and memory",
       claim_zh="「后续工作（如 FlashAttention、Linear Attention）就是要解决这个 n² 问题」")
def quadratic_answers(paths: dict | None = None, *, lengths=(256, 512, 1024)):
    """``paths``: name -> attend(q, k, v) for "reference", "flash" and "linear"."""
    paths = ANSWERS if paths is None else paths
    slopes = {}
    for name, attend in paths.items():
        flops, largest = zip(*(answer_cost(attend, n) for n in lengths))
        slopes[name] = {"flops": fit_exponent(lengths, flops), "memory": fit_exponent(lengths, largest)}
    ref, flash, lin = slopes["reference"], slopes["flash"], slopes["linear"]
    holds = (ref["memory"] > 1.8 and flash["memory"] < 1.2 and flash["flops"] > 1.8
             and lin["flops"] < 1.2 and lin["memory"] < 1.2)
    summary = say("attention-quadratic-answers", lengths=fmt(lengths), paths=exponents(slopes, "flops", "memory"))
    return {"lengths": lengths, "exponents": slopes}, holds, summary


# --- the heavy variant: time and peak memory of real calls (`qkv verify --full`) -------------
def source_benchmark():
    """``benchmarks.complexity`` from the source checkout qkv runs from, or None when installed without it."""
    root = Path(__file__).resolve().parents[3]  # src/qkv/claims/complexity.py -> the checkout
    if str(root) not in sys.path and (root / "benchmarks" / "complexity.py").is_file():
        sys.path.append(str(root))
    try:
        return importlib.import_module("benchmarks.complexity")
    except ImportError:
        return None


def builtin_rows(lengths, *, repeats: int = 3, heads: int = 8, head_dim: int = 64) -> list[dict]:
    """Rows {n, path, seconds, peak_mb} without the benchmarks package: median seconds of ``repeats`` calls;
    peak = the CUDA allocator's peak, or on a CPU the largest tensor a call creates (a lower bound)."""
    device, rows = resolve_device("auto"), []
    for n in lengths:
        q, k, v = (torch.randn(1, heads, n, head_dim, device=device) for _ in range(3))  # (B, H, n, D)
        for path, attend in PATHS.items():
            with torch.inference_mode():
                attend(q, k, v)  # warm up
                seconds = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    attend(q, k, v)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds.append(time.perf_counter() - t0)
                peak = peak_bytes(lambda: attend(q, k, v), device)
            rows.append({"n": n, "path": path, "seconds": statistics.median(seconds), "peak_mb": peak / 2**20})
    return rows


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak extra bytes of ``fn()``: the CUDA allocator's, or the largest tensor it creates on a CPU."""
    if device.type != "cuda":
        return cost(fn)[1]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure_complexity(lengths=FULL_LENGTHS, *, repeats: int = 3) -> list[dict]:
    """Rows {n, path, seconds, peak_mb} for the reference, fused, flash and linear paths (causal, 8 heads × 64,
    fp32): ``benchmarks.complexity.run`` in a source checkout (peak in a fresh process), else ``builtin_rows``."""
    bench = source_benchmark()
    with fixed_threads(None):  # all the free cores: this is about speed
        if bench is not None:
            return bench.run(list(lengths), repeats=repeats, paths=list(PATHS))
        return builtin_rows(lengths, repeats=repeats)


def row_exponents(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per path: {"time": slope of log seconds on log n, "memory": slope of log peak MB}."""
    out = {}
    for path in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == path]
        out[path] = {key: fit_exponent([r["n"] for r in mine], [r[field] for r in mine])
                     for key, field in (("time", "seconds"), ("memory", "peak_mb"))}
    return out


@check("attention-quadratic-measured", "Q4",
       "measured: the reference path's time and memory grow as n²; the fused kernel's and flash's memory far more "
       "slowly (about n); linear attention's time about as n",
       claim_zh="「Self-Attention 的时间和空间复杂度是序列长度的平方级——这就是 Transformer 处理超长文本时显存吃紧的根源」",
       full=True)
def quadratic_measured(rows: list[dict] | None = None, *, lengths=FULL_LENGTHS):
    """``rows``: {n, path, seconds, peak_mb} per (n, path), as ``measure_complexity`` returns (measured when None).

    Exponents are fitted on the longer half of the lengths, past fixed overheads. The fused and flash
    paths' time exponents are reported, not judged: their n² FLOPs are counted by attention-quadratic-answers.
    """
    rows = measure_complexity(lengths) if rows is None else rows
    ns = sorted({r["n"] for r in rows})
    e = row_exponents([r for r in rows if r["n"] >= ns[len(ns) // 2 - 1]])
    ref = e["reference"]
    holds = (ref["time"] > 1.4 and ref["memory"] > 1.7 and e["fused"]["memory"] < min(1.6, ref["memory"] - 0.4)
             and e["flash"]["memory"] < 1.3 and e["linear"]["time"] < 1.3)
    summary = say("attention-quadratic-measured", lo=ns[len(ns) // 2 - 1], hi=ns[-1], device=resolve_device("auto").type,
                  paths=exponents(e, "time", "memory"))
    return {"rows": rows, "exponents": e, "fitted_from_n": ns[len(ns) // 2 - 1]}, holds, summary
