"""Chapter 2, multi-head attention, as checks: 4·d_model² parameters whatever h (§2.2), the
FLOPs of one head (§2.3), a clear error when h does not divide d_model (§2.2 tip), and — on a
trained model — heads that attend differently (Q3).

Shapes: B batch, N layers, H heads, T length, C model width.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..viz.maps import attention_weights
from .measure import error_of, fmt
from .registry import check

HEADS = (1, 2, 4, 8, 16)


@check("mha-params", "§2.2", "multi-head attention has 4·d_model² parameters whatever the number of heads h")
def mha_params(make: Callable = MultiHeadAttention, *, d_model: int = 128, heads=HEADS):
    """``make(d_model, h)`` builds the module under test."""
    counts = [sum(p.numel() for p in make(d_model, h).parameters()) for h in heads]
    expected = 4 * d_model**2
    holds = all(c == expected for c in counts)
    summary = f"d_model={d_model}, h = {fmt(heads)}: {', '.join(map(str, counts))} parameters; 4·d² = {expected}"
    return {"d_model": d_model, "heads": heads, "parameters": counts, "four_d_squared": expected}, holds, summary


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def attention_flops(module: nn.Module, x: Tensor, **forward_kwargs) -> int:
    """Forward FLOPs by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention kernels)."""
    from torch.utils.flop_counter import FlopCounterMode

    # PyTorch registers FLOP formulas for the CUDA attention kernels but not for the CPU
    # flash kernel that F.scaled_dot_product_attention uses here; count it with the same formula.
    extra = {}
    if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=extra) as counter:
        module(x, **forward_kwargs)
    return counter.get_total_flops()


@check("mha-flops", "§2.3",
       "the FLOP count of multi-head attention is the same as one head's, up to lower-order terms")
def mha_flops(make: Callable = MultiHeadAttention, *, d_model: int = 128, n: int = 64, heads=HEADS):
    """``make(d_model, h)`` builds the module; counted on the fused and the reference (``return_weights``) path."""
    x = torch.randn(1, n, d_model)
    fused = [attention_flops(make(d_model, h), x) for h in heads]
    reference = [attention_flops(make(d_model, h), x, return_weights=True) for h in heads]
    formula = 8 * n * d_model**2 + 4 * n**2 * d_model  # 4 projections 2·n·d² + QKᵀ and W·V 2·n²·d each
    spread = max(fused + reference) / min(fused + reference)
    holds = spread <= 1.01
    summary = (f"n={n}, d_model={d_model}, h = {fmt(heads)}: {', '.join(f'{f / 1e6:.3f}' for f in fused)} MFLOP "
               f"(fused), {', '.join(f'{f / 1e6:.3f}' for f in reference)} (reference); max/min = {spread:.4f}; "
               f"8nd² + 4n²d = {formula / 1e6:.3f} M")
    return {"n": n, "d_model": d_model, "heads": heads, "flops_fused": fused, "flops_reference": reference,
            "formula": formula, "max_over_min": spread}, holds, summary


@check("heads-divisible", "§2.2 tip", "d_model not divisible by h raises a clear error")
def heads_divisible(make: Callable = MultiHeadAttention):
    """``make(d_model, h)`` must raise ValueError/TypeError naming both numbers when h does not divide d_model."""
    bad = [(10, 3), (512, 7), (768, 10)]
    good = [(512, 8), (768, 12), (1024, 16)]  # the spec's examples: paper, BERT-base, BERT-large
    errors = {f"{d}/{h}": error_of(lambda: make(d, h)) for d, h in bad}  # an AssertionError is not clear
    clear = all(m.startswith(("ValueError", "TypeError")) and str(d) in m and str(h) in m
                for (d, h), m in zip(bad, errors.values()))
    built = [error_of(lambda: make(d, h)) == "no error" for d, h in good]
    holds = clear and all(built)
    first = next(iter(errors.values()))
    summary = f"{len(bad)} bad (d, h) pairs → {first!r} …; the spec's 512/8, 768/12, 1024/16 build: {all(built)}"
    return {"errors": errors, "valid_pairs_build": built}, holds, summary


# --- Q3: heads of a trained model (needs --run) ----------------------------------------------
def head_distances(model: nn.Module, ids: Tensor) -> Tensor:
    """Mean pairwise total-variation distance between heads' attention rows, per layer: ids (B, T) -> (N,).

    TV(p, q) = ½ Σ|p − q| per query row, averaged over rows, batch and the H(H−1)/2 head pairs.
    """
    att = attention_weights(model, ids)  # (N, B, H, T, T)
    H = att.size(2)
    tv = 0.5 * (att[:, :, :, None] - att[:, :, None, :]).abs().sum(-1)  # (N, B, H, H, T)
    pairs = torch.triu(torch.ones(H, H, dtype=torch.bool), diagonal=1)  # (H, H), i < j
    return tv.mean(dim=(1, 4))[:, pairs].mean(-1)  # (N,)


@check("head-diversity", "Q3", "the heads of a trained model attend differently (against the same model at init)",
       needs_run=True)
def head_diversity(trained: nn.Module, ids: Tensor, *, initial: nn.Module | None = None):
    """``trained``: a qkv GPT or Encoder; ``ids`` (B, T); ``initial``: the baseline (default: a fresh
    model of the same configuration)."""
    if initial is None:
        initial = type(trained)(trained.config).to(next(trained.parameters()).device).eval()
    t, i = head_distances(trained, ids), head_distances(initial, ids)
    holds = bool(t.mean() > 2 * i.mean() and t.mean() > 0.05)
    summary = (f"mean pairwise TV distance between heads, per layer: trained {fmt(t.tolist())} vs init "
               f"{fmt(i.tolist())} (on {ids.numel()} tokens)")
    measured = {"trained_per_layer": t, "init_per_layer": i, "trained_mean": t.mean(), "init_mean": i.mean(),
                "tokens": ids.numel()}
    return measured, holds, summary
