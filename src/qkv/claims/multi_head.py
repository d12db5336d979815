"""Chapter 2, multi-head attention, as checks: the paper's formula, head by head (§2); 4·d_model²
parameters whatever h (§2.2), the FLOPs of one head (§2.3), a clear error when h does not
divide d_model (§2.2 tip), the head counts of known models with d_k = d_model / h (Q11), and —
on a trained model — heads that attend differently (Q3).

Shapes: B batch, N layers, H heads, T length, C model width.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from ..viz.maps import attention_weights
from .measure import FLOAT_TOL, error_of, fmt, rel_err
from .messages import Joined, Term, say
from .registry import check

HEADS = (1, 2, 4, 8, 16)


def heads_one_by_one(mha: nn.Module, x: Tensor) -> Tensor:
    """Concat(head_1 … head_h) W_O with head_i = Attention(X W_i^Q, X W_i^K, X W_i^V), each W_i the i-th
    d_k rows of one projection (§2.2): a loop over heads, (B, T, C) -> (B, T, C)."""
    h = mha.num_heads
    d_k = mha.q_proj.out_features // h
    heads = []
    for i in range(h):
        rows = slice(i * d_k, (i + 1) * d_k)  # head i's slice of W_Q, W_K, W_V: (d_k, C)
        q, k, v = (x @ p.weight[rows].T for p in (mha.q_proj, mha.k_proj, mha.v_proj))  # (B, T, d_k) each
        heads.append(torch.softmax(q @ k.transpose(-2, -1) / d_k**0.5, dim=-1) @ v)  # (B, T, d_k)
    return torch.cat(heads, dim=-1) @ mha.out_proj.weight.T  # (B, T, h·d_k) -> (B, T, C)


@check("mha-formula", "§2",
       "MultiHead(X) = Concat(head_1, …, head_h)·W_O, head_i = Attention(X W_i^Q, X W_i^K, X W_i^V) with "
       "d_k = d_model / h, each W_i a slice of one d_model × d_model matrix",
       claim_zh="「MultiHead(Q, K, V) = Concat(head₁, head₂, ..., head_h) · W^O」"
                "「每个头的 Q / K / V 维度是 d_k = d_model / h」")
def mha_formula(mha: nn.Module | None = None, *, d_model: int = 32, h: int = 4):
    """``mha``: MultiHeadAttention-like, bias-free ``q_proj`` … ``out_proj`` and ``num_heads``."""
    mha = MultiHeadAttention(d_model, h) if mha is None else mha
    x = torch.randn(2, 7, d_model)
    with torch.no_grad():
        err = rel_err(mha(x), heads_one_by_one(mha, x))
    holds = err < FLOAT_TOL
    summary = say("mha-formula", d_model=d_model, h=mha.num_heads, err=err)
    return {"rel_error": err, "num_heads": mha.num_heads}, holds, summary


@check("mha-params", "§2.2", "multi-head attention has 4·d_model² parameters whatever the number of heads h",
       claim_zh="「最终\"多头\"和\"单头\"的参数总量一致（仍为 4 × d_model²）」")
def mha_params(make: Callable = MultiHeadAttention, *, d_model: int = 128, heads=HEADS):
    """``make(d_model, h)`` builds the module under test."""
    counts = [sum(p.numel() for p in make(d_model, h).parameters()) for h in heads]
    expected = 4 * d_model**2
    holds = all(c == expected for c in counts)
    summary = say("mha-params", d_model=d_model, heads=fmt(heads), counts=", ".join(map(str, counts)), expected=expected)
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
       "the FLOP count of multi-head attention is the same as one head's, up to lower-order terms",
       claim_zh="「所以总计算量大致不变」")
def mha_flops(make: Callable = MultiHeadAttention, *, d_model: int = 128, n: int = 64, heads=HEADS):
    """``make(d_model, h)`` builds the module; counted on the fused and the reference (``return_weights``) path."""
    x = torch.randn(1, n, d_model)
    fused = [attention_flops(make(d_model, h), x) for h in heads]
    reference = [attention_flops(make(d_model, h), x, return_weights=True) for h in heads]
    formula = 8 * n * d_model**2 + 4 * n**2 * d_model  # 4 projections 2·n·d² + QKᵀ and W·V 2·n²·d each
    spread = max(fused + reference) / min(fused + reference)
    holds = spread <= 1.01
    summary = say("mha-flops", n=n, d_model=d_model, heads=fmt(heads), fused=", ".join(f"{f / 1e6:.3f}" for f in fused),
                  reference=", ".join(f"{f / 1e6:.3f}" for f in reference), spread=spread, formula=formula / 1e6)
    return {"n": n, "d_model": d_model, "heads": heads, "flops_fused": fused, "flops_reference": reference,
            "formula": formula, "max_over_min": spread}, holds, summary


@check("heads-divisible", "§2.2 tip", "d_model not divisible by h raises a clear error",
       claim_zh="「当 d_model 不能被 h 整除时，计算会直接报错」")
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
    summary = say("heads-divisible", bad=len(bad), first=first, built=all(built))
    return {"errors": errors, "valid_pairs_build": built}, holds, summary


# --- Q11: the head counts of known models ---------------------------------------------------
PUBLISHED = {  # model: (d_model, heads, where it is published)
    "Transformer base": (512, 8, "Vaswani et al. 2017, Table 3"),
    "BERT-base": (768, 12, "Devlin et al. 2019, §3"),
    "BERT-large": (1024, 16, "Devlin et al. 2019, §3"),
    "GPT-2 small": (768, 12, "OpenAI's released hparams (n_head), Hugging Face gpt2 config"),
    "GPT-2 medium": (1024, 16, "the same, gpt2-medium"),
    "GPT-2 large": (1280, 20, "the same, gpt2-large"),
    "GPT-2 xl": (1600, 25, "the same, gpt2-xl"),
}
SPEC_HEADS = {"Transformer base": 8, "BERT-base": 12, "BERT-large": 16, "GPT-2 small": 12, "GPT-2 medium": 16,
              "GPT-2 large": 20, "GPT-2 xl": 25}  # FAQ Q11's numbers


def local_configs() -> dict[str, dict[str, tuple[int, int]]]:
    """model -> {source: (d_model, heads)} from what this machine holds: qkv's presets and, when installed,
    transformers' configuration classes (their defaults; nothing downloaded)."""
    from ..models import ModelConfig

    found = {name: {} for name in PUBLISHED}
    for model, preset in (("Transformer base", "paper-base"), ("GPT-2 small", "gpt2")):
        c = ModelConfig.preset(preset)
        found[model][f"qkv preset {preset}"] = (c.d_model, c.attention.num_heads)
    try:
        from transformers import BertConfig, GPT2Config
    except ImportError:
        return found
    found["BERT-base"]["transformers BertConfig()"] = (BertConfig().hidden_size, BertConfig().num_attention_heads)
    found["GPT-2 small"]["transformers GPT2Config()"] = (GPT2Config().n_embd, GPT2Config().n_head)
    return found


@check("head-counts", "Q11",
       "head counts of known models: base 8, BERT-base 12 / large 16, GPT-2 12 / 16 / 20 / 25; d_k = d_model / h "
       "is 64 in every one",
       claim_zh="「原论文 base 模型 h = 8；BERT-base h = 12、BERT-large h = 16；GPT-2 系列按尺寸递增：small h = 12、"
                "medium h = 16、large h = 20、xl h = 25」")
def head_counts(spec: dict | None = None, published: dict | None = None, make: Callable = MultiHeadAttention):
    """``spec``: model -> heads as the spec says; ``published``: model -> (d_model, heads, source)."""
    spec, published = SPEC_HEADS if spec is None else spec, PUBLISHED if published is None else published
    local = local_configs()
    agree = {m: all(v == published[m][:2] for v in local.get(m, {}).values()) for m in published}
    d_k = {}
    for m, (d, h, _) in published.items():
        with torch.device("meta"):
            d_k[m] = make(d, h).head_dim if d % h == 0 else d / h
    holds = (all(spec.get(m) == published[m][1] for m in published) and all(agree.values())
             and all(v == 64 for v in d_k.values()))
    models = Joined([say("head-counts/model", model=m, d=published[m][0], h=published[m][1], d_k=d_k[m])
                     for m in published])
    summary = say("head-counts", models=models, match=all(spec.get(m) == published[m][1] for m in published),
                  sources=Joined([Term(s) for v in local.values() for s in v], sep=", "))
    measured = {"spec_heads": spec, "published": published, "local": local, "local_agrees": agree, "d_k": d_k}
    return measured, holds, summary


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
       claim_zh="「这种\"自然分工\"是模型自主学出来的，不是人工指定的」", needs_run=True)
def head_diversity(trained: nn.Module, ids: Tensor, *, initial: nn.Module | None = None):
    """``trained``: a qkv GPT or Encoder; ``ids`` (B, T); ``initial``: the baseline (default: a fresh
    model of the same configuration)."""
    if initial is None:
        initial = type(trained)(trained.config).to(next(trained.parameters()).device).eval()
    t, i = head_distances(trained, ids), head_distances(initial, ids)
    holds = bool(t.mean() > 2 * i.mean() and t.mean() > 0.05)
    summary = say("head-diversity", trained=fmt(t.tolist()), init=fmt(i.tolist()), tokens=ids.numel())
    measured = {"trained_per_layer": t, "init_per_layer": i, "trained_mean": t.mean(), "init_mean": i.mean(),
                "tokens": ids.numel()}
    return measured, holds, summary
