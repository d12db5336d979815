"""Chapter 3, positional encoding, as checks: self-attention without PE is permutation-equivariant
and every PE breaks that (§3); sinusoidal PE's range (§3.1 / Q10), wavelengths (§3.1 / Q8) and
shift-as-rotation (§3.1); learned PE ends at max_len while sinusoidal PE runs on (§3.3 / Q9).

Shapes: B batch, T length, C model width, H heads.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ..nn.attention import MultiHeadAttention
from ..models import GPT, Encoder, ModelConfig
from ..nn.positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .measure import FLOAT_TOL, error_of, fmt, rel_err
from .messages import say
from .registry import check

def equivariance_error(f: Callable[[Tensor], Tensor], x: Tensor, perm: Tensor) -> float:
    """Relative max |f(x[:, perm]) − f(x)[:, perm]|: 0 for a permutation-equivariant f."""
    with torch.no_grad():
        return rel_err(f(x[:, perm]), f(x)[:, perm])


def position_variants(d: int = 32, h: int = 4, T: int = 10) -> tuple[dict, dict]:
    """(no-PE, with-PE) dicts name -> (f, input), on MultiHeadAttention and on the whole Encoder."""
    x, ids = torch.randn(2, T, d), torch.randint(0, 64, (2, T))
    sin, learned = SinusoidalPositionalEncoding(d), LearnedPositionalEmbedding(T, d)
    mha, rope_mha = MultiHeadAttention(d, h), MultiHeadAttention(d, h, rope=RotaryEmbedding(d // h))
    alibi_mha = MultiHeadAttention(d, h, alibi=ALiBi(h))

    def encoder(p):
        model = Encoder(ModelConfig(vocab_size=64, d_model=d, attention=dict(num_heads=h), position=dict(kind=p),
                                    num_layers=2, max_len=T))
        return lambda i: model.eval()(i).last_hidden_state

    without = {"MHA": (mha, x), "Encoder": (encoder("none"), ids)}
    with_pe = {"MHA+sinusoidal": (lambda t: mha(t + sin(T)), x), "MHA+learned": (lambda t: mha(t + learned(T)), x),
               "MHA+RoPE": (rope_mha, x), "MHA+ALiBi": (alibi_mha, x)}
    with_pe.update({f"Encoder({p})": (encoder(p), ids) for p in ("sinusoidal", "learned", "rope", "alibi")})
    return without, with_pe


@check("permutation-equivariance", "§3",
       "without PE self-attention is permutation-equivariant (exactly, up to float error); sinusoidal, learned, "
       "RoPE and ALiBi break it",
       claim_zh="「Self-Attention 在数学上是 permutation equivariant（置换等变）的」「后续工作如 RoPE、ALiBi 等则是改造注意力机制本身」")
def permutation_equivariance(without_pe: dict | None = None, with_pe: dict | None = None, *, broken: float = 1e-4):
    """Dicts name -> (f, x): f maps x (B, T, …) to (B, T, C); every x has the same T."""
    if without_pe is None or with_pe is None:
        default_without, default_with = position_variants()
        without_pe = default_without if without_pe is None else without_pe
        with_pe = default_with if with_pe is None else with_pe
    T = next(iter(without_pe.values()))[1].size(1)  # every input shares this length
    perm = torch.randperm(T)
    err_without = {n: equivariance_error(f, x, perm) for n, (f, x) in without_pe.items()}
    err_with = {n: equivariance_error(f, x, perm) for n, (f, x) in with_pe.items()}
    holds = max(err_without.values()) < FLOAT_TOL and min(err_with.values()) > broken
    summary = say("permutation-equivariance", without=fmt(err_without.values()), names=", ".join(err_without),
                  least=min(err_with.values()), count=len(err_with))
    measured = {"without_pe": err_without, "with_pe": err_with, "tolerance": FLOAT_TOL, "broken_above": broken}
    return measured, holds, summary


@check("sinusoidal-range", "§3.1 / Q10", "sinusoidal PE values lie in [-1, 1]",
       claim_zh="「sin / cos 的取值范围本身就是 [-1, 1]」")
def sinusoidal_range(pe: Callable | None = None, *, length: int = 4096):
    """``pe(T)`` -> (T, C)."""
    pe = SinusoidalPositionalEncoding(128) if pe is None else pe
    with torch.no_grad():
        table = pe(length)  # (T, C)
    lo, hi = float(table.min()), float(table.max())
    holds = -1 - 1e-6 <= lo and hi <= 1 + 1e-6
    summary = say("sinusoidal-range", last=length - 1, d=table.size(-1), lo=lo, hi=hi)
    return {"length": length, "min": lo, "max": hi}, holds, summary


def pe_frequencies(pe: Callable) -> Tensor:
    """Angular frequency of each (sin, cos) pair, read off PE(1) = (sin ω_i, cos ω_i)."""
    with torch.no_grad():
        p1 = pe(torch.tensor([1]))[0].double()  # (C,)
    return torch.atan2(p1[0::2], p1[1::2])  # (C/2,)


@check("sinusoidal-wavelengths", "§3.1 / Q8",
       "sinusoidal wavelengths run from 2π (i = 0) to about 10000·2π (i = d/2 − 1)",
       claim_zh="「能让最高频（i=0）的波长是 2π、最低频（i=d/2-1）的波长大约是 10000 × 2π」")
def sinusoidal_wavelengths(pe: Callable | None = None, *, d_model: int = 128, base: float = 10000.0):
    """``pe(positions)`` -> (…, C) with (sin, cos) pairs on (even, odd) dimensions."""
    pe = SinusoidalPositionalEncoding(d_model) if pe is None else pe
    wave = (2 * math.pi / pe_frequencies(pe)).tolist()
    ratios = [b / a for a, b in zip(wave, wave[1:])]
    step = base ** (2 / d_model)  # a geometric progression with this ratio
    last = 2 * math.pi * base ** (1 - 2 / d_model)  # exactly: the top pair is i = d/2 − 1, not d/2
    holds = (abs(wave[0] / (2 * math.pi) - 1) < 1e-4 and all(abs(r / step - 1) < 1e-3 for r in ratios)
             and abs(wave[-1] / last - 1) < 1e-3)
    summary = say("sinusoidal-wavelengths", d_model=d_model, first=wave[0], two_pi=2 * math.pi, last=wave[-1],
                  ratio=wave[-1] / (2 * math.pi * base), expected=last, step=step)
    return {"d_model": d_model, "first": wave[0], "last": wave[-1], "expected_last": last,
            "last_over_10000_2pi": wave[-1] / (2 * math.pi * base), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "expected_ratio": step}, holds, summary


def rotation_for_shift(pe_k: Tensor) -> Tensor:
    """Block-diagonal R_k (C, C) from PE(k) alone, b = kω_i:

        [sin(a+b), cos(a+b)] = [[cos b, sin b], [−sin b, cos b]] · [sin a, cos a]
    """
    s, c = pe_k[0::2], pe_k[1::2]  # sin kω_i, cos kω_i, each (C/2,)
    blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # (C/2, 2, 2)
    return torch.block_diag(*blocks)


@check("sinusoidal-rotation", "§3.1",
       "PE(pos + k) = R_k·PE(pos) for a fixed block rotation R_k that depends only on k",
       claim_zh="「为什么论文里选 Sinusoidal 的设计动机」（论文 3.5 节：PE(pos+k) 可以表示为 PE(pos) 的线性函数）")
def sinusoidal_rotation(pe: Callable | None = None, *, shifts=(1, 7, 50), length: int = 512):
    """``pe(positions)`` -> (…, C); R_k is built from PE(k) alone and applied to every position."""
    pe = SinusoidalPositionalEncoding(64) if pe is None else pe
    errors, orth = [], []
    with torch.no_grad():
        table = pe(torch.arange(length + max(shifts))).double()  # (T, C)
        for k in shifts:
            R = rotation_for_shift(table[k])  # (C, C), built from PE(k) only
            errors.append(float((table[k:k + length] - table[:length] @ R.T).abs().max()))
            orth.append(float((R.T @ R - torch.eye(R.size(0), dtype=R.dtype)).abs().max()))
    holds = max(errors) < 1e-4 and max(orth) < 1e-4
    summary = say("sinusoidal-rotation", shifts=fmt(shifts), last=length - 1, errors=fmt(errors), orth=max(orth))
    return {"shifts": shifts, "max_error": errors, "max_orthogonality_error": orth}, holds, summary


@check("learned-max-len", "§3.3 / Q9",
       "learned PE has no vector beyond max_len (a clear error); sinusoidal runs at any length",
       claim_zh="「超出训练时设置的最大长度（例如 512）时该位置的 embedding 没有训练值」「Sinusoidal 没有这个限制」")
def learned_max_len(learned: Callable | None = None, sinusoidal: Callable | None = None, *, max_len: int = 16):
    """``learned(T)`` must raise a ValueError naming max_len past it; ``sinusoidal(T)`` must run far beyond."""
    learned = LearnedPositionalEmbedding(max_len, 8) if learned is None else learned
    sinusoidal = SinusoidalPositionalEncoding(8) if sinusoidal is None else sinusoidal
    inside = error_of(lambda: learned(max_len))
    beyond = error_of(lambda: learned(max_len + 1))
    far = 100 * max_len
    with torch.no_grad():
        table = sinusoidal(far)
    sin_ok = table.shape[0] == far and bool(torch.isfinite(table).all())
    cfg = dict(vocab_size=32, d_model=16, attention=dict(num_heads=2), num_layers=1, max_len=max_len)
    ids = torch.randint(0, 32, (1, max_len + 1))
    gpt_learned = error_of(lambda: GPT(ModelConfig(**cfg, position=dict(kind="learned")))(ids))
    with torch.no_grad():
        far_ids = torch.randint(0, 32, (1, 4 * max_len))
        logits = GPT(ModelConfig(**cfg, position=dict(kind="sinusoidal")))(far_ids).logits
    clear = beyond.startswith("ValueError") and str(max_len) in beyond and gpt_learned.startswith("ValueError")
    holds = inside == "no error" and clear and sin_ok and bool(torch.isfinite(logits).all())
    summary = say("learned-max-len", max_len=max_len, beyond_n=max_len + 1, beyond=beyond, far=far, finite=sin_ok,
                  gpt_n=4 * max_len)
    return {"learned_at_max_len": inside, "learned_beyond": beyond, "gpt_learned_beyond": gpt_learned,
            "sinusoidal_length": far, "sinusoidal_finite": sin_ok,
            "gpt_sinusoidal_finite": bool(torch.isfinite(logits).all())}, holds, summary
