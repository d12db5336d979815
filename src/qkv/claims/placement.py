"""Where and how position enters, as checks: added before attention, not after (chapter 4's
pitfall, Q6, Q7); inside attention as relative position (RoPE, ALiBi; Q6); and at what scale
beside the token embeddings (Q10, a correction).

Shapes: B batch, T length, C model width, H heads, D head width.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from ..nn.block import TransformerBlock
from ..nn.positional import ALiBi, RotaryEmbedding, SinusoidalPositionalEncoding
from .measure import FLOAT_TOL, rel_err
from .messages import say
from .registry import check


def two_layers(d: int = 32, h: int = 4) -> Callable[..., tuple[Tensor, Tensor]]:
    """stack(x, pe_first=…) -> (first layer's attention output, second layer's output), x (B, T, C): PE added
    to x before the first layer, or to the first layer's output before the second."""
    first, second = TransformerBlock(d, h, 2 * d).eval(), TransformerBlock(d, h, 2 * d).eval()
    pe = SinusoidalPositionalEncoding(d)

    def stack(x: Tensor, *, pe_first: bool) -> tuple[Tensor, Tensor]:
        seen = []
        hook = first.attn.register_forward_hook(lambda m, args, out: seen.append(out))
        try:
            hidden = first(x + pe(x.size(1)) if pe_first else x).hidden  # (B, T, C)
        finally:
            hook.remove()
        out = second(hidden if pe_first else hidden + pe(x.size(1))).hidden  # (B, T, C)
        return seen[0], out

    return stack


@check("pe-before-attention", "§4 / Q6 / Q7",
       "PE must enter before attention: added after the first layer's attention, that layer has already "
       "aggregated without order (it stays permutation-equivariant)",
       claim_zh="「不要先做 Self-Attention 再加 PE：位置信息必须在注意力之前进入，否则模型已经做完\"无序聚合\"了」"
                "「把\"加在 Embedding 之后、进入注意力之前\"作为默认起点」")
def pe_before_attention(stack: Callable | None = None, *, T: int = 8, d: int = 32):
    """``stack(x, pe_first=bool)`` -> (first attention output, final output), each (B, T, C)."""
    stack = two_layers(d) if stack is None else stack
    x, perm = torch.randn(2, T, d), torch.randperm(T)
    err = {}
    with torch.no_grad():
        for where, pe_first in (("before", True), ("after", False)):
            attn, out = stack(x, pe_first=pe_first)
            attn_p, out_p = stack(x[:, perm], pe_first=pe_first)
            err[where] = {"first_attention": rel_err(attn_p, attn[:, perm]), "output": rel_err(out_p, out[:, perm])}
    holds = (err["after"]["first_attention"] < FLOAT_TOL and err["before"]["first_attention"] > 1e-2
             and err["after"]["output"] > 1e-2)
    summary = say("pe-before-attention", T=T, before=err["before"]["first_attention"],
                  after=err["after"]["first_attention"], before_out=err["before"]["output"],
                  after_out=err["after"]["output"])
    return err, holds, summary


def shifted_scores(rope: nn.Module, q: Tensor, k: Tensor, shift: int) -> Tensor:
    """RoPE scores q_m·k_n with every position moved by ``shift``: q, k (B, H, T, D) -> (B, H, T, T)."""
    return rope(q, shift) @ rope(k, shift).transpose(-2, -1)


@check("rope-alibi-relative", "Q6",
       "RoPE (a rotation of Q and K) and ALiBi (a linear bias on the scores) put position into attention "
       "itself, as relative position: the scores do not change when every position moves",
       claim_zh="「RoPE 把位置编码作为旋转矩阵作用于 Q / K，ALiBi 把线性偏置加到注意力分数上」")
def rope_alibi_relative(rope: nn.Module | None = None, alibi: nn.Module | None = None, *, T: int = 16,
                        shift: int = 1000):
    """``rope(x (B, H, T, D), start)`` rotates; ``alibi(L, S, positions=…)`` -> bias (H, L, S)."""
    rope = RotaryEmbedding(16) if rope is None else rope
    alibi = ALiBi(4) if alibi is None else alibi
    q, k = torch.randn(1, 4, T, 16), torch.randn(1, 4, T, 16)  # (B, H, T, D)
    rope_err = rel_err(shifted_scores(rope, q, k, shift), shifted_scores(rope, q, k, 0))
    rope_moves = rel_err(rope(q, 0) @ k.transpose(-2, -1), q @ k.transpose(-2, -1))  # it does change the scores
    bias = alibi(T, T)  # (H, L, S)
    moved = alibi(T, T + shift, positions=torch.arange(T) + shift)[..., shift:]  # queries and keys moved together
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs()  # (L, S)
    slopes = -bias / dist.clamp_min(1)  # (H, L, S): one constant per head if the bias is linear in |i − j|
    linear = float((slopes - slopes[:, 1:2, :1]).abs()[:, dist > 0].max())
    alibi_err = float((moved - bias).abs().max())
    holds = rope_err < 1e-4 and rope_moves > 1e-2 and alibi_err < FLOAT_TOL and linear < FLOAT_TOL
    summary = say("rope-alibi-relative", T=T, shift=shift, rope=rope_err, rotating=rope_moves, alibi=alibi_err,
                  linear=linear)
    return {"rope_shift_rel_error": rope_err, "rope_effect": rope_moves, "alibi_shift_error": alibi_err,
            "alibi_linearity_error": linear}, holds, summary


def pe_over_token(token: nn.Embedding, *, scale: float = 1.0, T: int = 64) -> dict:
    """How big PE is beside token vectors (× ``scale``): norms' ratio and max |value| before and after adding."""
    ids = torch.randint(0, token.num_embeddings, (T,))
    with torch.no_grad():
        e = token(ids) * scale  # (T, C)
        x = e + SinusoidalPositionalEncoding(token.embedding_dim)(T)  # (T, C)
    return {"pe_over_token_norm": float((x - e).norm(dim=-1).mean() / e.norm(dim=-1).mean()),
            "max_abs_token": float(e.abs().max()), "max_abs_sum": float(x.abs().max())}


@check("embedding-plus-pe", "Q10 (correction)",
       "beside small-variance token embeddings (std 0.02) sinusoidal PE is no small change: its norm is tens of "
       "times theirs; the paper multiplies embeddings by √d_model",
       claim_zh="原文「与 embedding（一般初始化为均值为 0、方差较小的随机值）相加后，X 的数值范围变化不大」；"
                "更正：方差较小时 PE 的范数是 token 向量的几十倍，论文把 embedding 乘以 √d_model")
def embedding_plus_pe(small: nn.Embedding | None = None, *, d_model: int = 512):
    """``small``: token embeddings with a small initialisation (GPT-2's and BERT's std 0.02 by default)."""
    if small is None:
        small = nn.Embedding(1000, d_model)
        nn.init.normal_(small.weight, std=0.02)
    d = small.embedding_dim
    cases = {"small": pe_over_token(small), "small × √d_model": pe_over_token(small, scale=d**0.5)}
    s, scaled = cases["small"], cases["small × √d_model"]
    holds = s["pe_over_token_norm"] > 10 and scaled["pe_over_token_norm"] < 3
    std = float(small.weight.detach().std())
    summary = say("embedding-plus-pe", d=d, std=std, ratio=s["pe_over_token_norm"], token=s["max_abs_token"],
                  sum=s["max_abs_sum"], ratio2=scaled["pe_over_token_norm"], token2=scaled["max_abs_token"],
                  sum2=scaled["max_abs_sum"])
    return cases, holds, summary
