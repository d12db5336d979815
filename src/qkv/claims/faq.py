"""FAQ entries that are not a chapter's, as checks: Q and K must be computed separately (Q2);
attention scores are not symmetric (Q5); cross-attention takes Q from the decoder and K, V from
the encoder (Q13); a token attends to itself (Q16); weights summing to one keep the output's
scale whatever the length (Q17).

Shapes: B batch, T length (S the source's), C model width, N layers, H heads.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from ..nn.attention import SelfAttention, scaled_dot_product_attention
from ..models import GPT, ModelConfig, Transformer
from ..viz.maps import attention_weights
from .measure import FLOAT_TOL, fmt, rel_err
from .messages import Joined, Term, render, say
from .registry import Claim, check, measured_by_study, study_summary


def self_argmax_fraction(module: nn.Module, x: Tensor) -> float:
    """The fraction of rows of QKᵀ whose largest score is the token's own: x (B, T, C)."""
    scores = module.q_proj(x) @ module.k_proj(x).transpose(-2, -1)  # (B, T, T)
    return float((scores.argmax(-1) == torch.arange(x.size(1))).float().mean())


@check("separate-qk", "Q2",
       "Q, K, V must be computed separately: with W_K = W_Q the scores become each token's similarity with "
       "itself, and nearly every token attends most to itself",
       claim_zh="「但语义上 Q、K、V 必须分别计算，否则点积退化为\"被查询向量与自身的相似度\"」")
def separate_qk(module: nn.Module | None = None, *, d: int = 64, T: int = 32):
    """``module``: SelfAttention-like with separate ``q_proj`` and ``k_proj``; compared with itself tied."""
    module = SelfAttention(d) if module is None else module
    tied = SelfAttention(d)
    tied.q_proj = tied.k_proj = module.q_proj
    x = torch.randn(4, T, d)
    with torch.no_grad():
        frac = {"separate": self_argmax_fraction(module, x), "W_K = W_Q": self_argmax_fraction(tied, x)}
    holds = frac["separate"] < 0.3 and frac["W_K = W_Q"] > 0.9
    summary = say("separate-qk", d=d, T=T, separate=frac["separate"], chance=1 / T, tied=frac["W_K = W_Q"])
    return frac, holds, summary

@check("scores-not-symmetric", "Q5", "attention scores QKᵀ are not symmetric (W_Q and W_K are learned separately)",
       claim_zh="「W_Q 和 W_K 是两个独立学习的参数矩阵，一般并不相等，所以 Q·K^T 不对称」")
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
    summary = say("scores-not-symmetric", asym=asym, match=match)
    return {"relative_asymmetry": asym, "weights_match": match}, holds, summary


@check("attends-to-itself", "Q16", "a token attends to itself with non-zero weight",
       claim_zh="「可以，且默认会」「softmax 之后这个位置也会得到一个合法权重」")
def attends_to_itself(weights: dict | None = None):
    """``weights``: name -> a function returning (…, T, T) attention weights."""
    if weights is None:
        sa = SelfAttention(16)
        gpt = GPT(ModelConfig(vocab_size=32, d_model=16, attention=dict(num_heads=4), num_layers=2, max_len=16)).eval()
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
    summary = Joined([say("attends-to-itself/module", name=Term(n), least=v["min_self_weight"],
                          ratio=v["self_over_uniform"]) for n, v in diag.items()])
    return diag, holds, summary


def hidden_by_source(model: Transformer, src: Tensor, tgt: Tensor, *, cut: bool = False) -> dict:
    """What the decoder computes for ``tgt`` (B, T) over ``src`` (B, S): logits, the inputs of layer 0's
    cross-attention projections, its weights; ``cut`` zeroes every cross-attention output."""
    seen, hooks = {}, []
    cross = model.blocks[0].cross_attn
    hooks.append(cross.q_proj.register_forward_hook(lambda m, args, out: seen.setdefault("q_input", args[0])))
    hooks.append(cross.k_proj.register_forward_hook(lambda m, args, out: seen.setdefault("k_input", args[0])))
    if cut:
        hooks += [b.cross_attn.register_forward_hook(lambda m, args, out: (torch.zeros_like(out[0]), out[1])
                                                     if isinstance(out, tuple) else torch.zeros_like(out))
                  for b in model.blocks]
    try:
        out = model(src, tgt, return_attention=True)
    finally:
        for h in hooks:
            h.remove()
    return {"logits": out.logits, "memory": model.encode(src), "cross": out.cross_attentions[0], **seen}


@check("cross-attention", "Q13",
       "cross-attention takes Q from the decoder and K, V from the encoder; the source reaches the decoder only "
       "through it",
       claim_zh="「Cross-Attention 中 Q = W_QX_decoder、K = W_KX_encoder、V = W_VX_encoder」")
def cross_attention(model: nn.Module | None = None, *, S: int = 9, T: int = 5):
    """``model``: a qkv Transformer (encoder-decoder). Two sources, one target; then the same with every
    cross-attention output zeroed: the sources must then give identical logits."""
    if model is None:
        model = Transformer(ModelConfig(vocab_size=32, d_model=16, attention=dict(num_heads=4), num_layers=2,
                                        max_len=16))
    V = model.config.vocab_size
    src_a, src_b, tgt = torch.randint(0, V, (1, S)), torch.randint(0, V, (1, S)), torch.randint(0, V, (1, T))
    with torch.no_grad():
        a, b = hidden_by_source(model.eval(), src_a, tgt), hidden_by_source(model, src_b, tgt)
        cut_a, cut_b = hidden_by_source(model, src_a, tgt, cut=True), hidden_by_source(model, src_b, tgt, cut=True)
    m = {"cross_weights_shape": list(a["cross"].shape), "k_input_is_memory": rel_err(a["k_input"], a["memory"]),
         "q_input_change_with_source": rel_err(b["q_input"], a["q_input"]),
         "logits_change_with_source": rel_err(b["logits"], a["logits"]),
         "logits_change_with_cross_attention_cut": rel_err(cut_b["logits"], cut_a["logits"])}
    holds = (m["cross_weights_shape"][-2:] == [T, S] and m["k_input_is_memory"] == 0
             and m["q_input_change_with_source"] == 0 and m["logits_change_with_source"] > 1e-3
             and m["logits_change_with_cross_attention_cut"] == 0)
    summary = say("cross-attention", shape=tuple(m["cross_weights_shape"]), T=T, S=S, k=m["k_input_is_memory"],
                  q=m["q_input_change_with_source"], logits=m["logits_change_with_source"],
                  cut=m["logits_change_with_cross_attention_cut"])
    return m, holds, summary


@check("length-stable", "Q17",
       "weights summing to one make the output a weighted average: it stays within V's range at any length, "
       "where a plain sum grows with n",
       claim_zh="「这意味着 Self-Attention 的输出是\"当前 Query 对所有 Key 的加权平均\"，不会因为序列长度变化而数值漂移」")
def length_stable(attention=scaled_dot_product_attention, *, lengths=(16, 256, 4096), d: int = 16):
    """``attention`` returns (out, weights) with ``return_weights=True``."""
    bound, spread, plain_sum = [], [], []
    for n in lengths:
        q, k, v = torch.randn(8, d), torch.randn(n, d), torch.randn(n, d)  # (L, D), (S, D), (S, D)
        out, w = attention(q, k, v, return_weights=True)  # (L, D), (L, S)
        bound.append(float(out.abs().max() / v.abs().max()))
        spread.append(float(out.std()))
        plain_sum.append(float(v.sum(0).abs().mean()))  # Σ_j v_j: summing without weights
    holds = max(bound) <= 1 + FLOAT_TOL and plain_sum[-1] > 4 * plain_sum[0]
    summary = say("length-stable", lengths=fmt(lengths), bound=fmt(bound), spread=fmt(spread), plain=fmt(plain_sum))
    return {"lengths": lengths, "max_out_over_max_v": bound, "out_std": spread, "plain_sum": plain_sum}, holds, summary


# --- Q4's memory, at decode time: the KV cache (DeepSeek-V2's claim, measured by `qkv study kv`) ------------
def kv_cache_row(row: Claim) -> Claim:
    """The row with the study's verdict and numbers once `qkv study kv` has run; as registered (how to run it) before."""
    summary = study_summary("kv")
    if summary is None:
        return row
    v = summary["verdict"]
    message = say("kv-cache-mla", verdict=say("study/holds" if v["holds"] else "study/fails"),
                  date=summary.get("run", {}).get("date", "?"), seeds=v["seeds"], mla=v["bpc_mla"], mha=v["bpc_mha"],
                  diff=v["difference"], noise=v["noise"], mla_n=v["mla_numbers"], mha_n=v["mha_numbers"],
                  reduction=100 * v["reduction"], bar=100 * v["bar"])
    return dataclasses.replace(row, measured=v, summary=render(message, "en"), summary_zh=render(message, "zh"))


measured_by_study(
    "mla-kv-cache", "Q4",
    "multi-head latent attention is at least as good as MHA with a KV cache at least 90 % smaller (DeepSeek-V2, "
    "arXiv 2405.04434 §2.1, Tables 1 and 9)",
    "needs eight trained models (about half an hour on two cores), beyond verify's budget; run `qkv study kv` "
    "(results in runs/study-kv) and this row shows its verdict and numbers",
    kv_cache_row,
    claim_zh="「这就是 Transformer 处理超长文本时显存吃紧的根源」（解码时的键值缓存：DeepSeek-V2 称多头潜在注意力"
             "至少与 MHA 一样好，而键值缓存小 90 % 以上）",
    reason_zh="需要训练八个模型（两个核心上约半小时），超出 verify 的时间预算；运行 `qkv study kv`（结果在 "
              "runs/study-kv）后，这一行给出它的结论和测量值")
