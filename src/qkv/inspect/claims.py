"""The spec's claims as checks that measure qkv's own modules.

Each check returns a ``Claim`` record {name, claim, section, measured, holds, summary}.
Its core takes the function or module under test as an argument (qkv's by default), so a
test can hand it a broken one and watch it fail: a check that cannot fail proves nothing.
Sections (§1.3 …) and FAQ numbers (Q3 …) are those of the spec
(seed/000_e6b97a1375c22a3f.txt). Every check is seeded and runs in about a second on a CPU.

Shapes: B batch, T length, C model width, H heads, D head width, L/S query/key length.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, SelfAttention, scaled_dot_product_attention
from ..models import GPT, Encoder, ModelConfig
from ..positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding

FLOAT_TOL = 1e-5  # "exact up to float error" in fp32 at these sizes


@dataclass
class Claim:
    """One claim of the spec, what was measured, and whether it holds."""

    name: str  # short id for `qkv verify --only`
    claim: str
    section: str  # the spec's section or FAQ number
    measured: dict
    holds: bool
    summary: str  # the measured numbers in one line

    def to_dict(self) -> dict:
        return asdict(self)


CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check, in the spec's order


def _plain(x):
    """Measured values as JSON-ready numbers (6 significant digits), lists and strings."""
    if isinstance(x, Tensor):
        x = x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, torch.Size)):
        return [_plain(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


@contextlib.contextmanager
def seeded(seed: int):
    """Seeded, on one intra-op thread, leaving the caller's RNG and thread count as they were.

    The checks' tensors are tiny: one thread beats a thread pool (4× faster on a busy 2-core
    machine) and makes the numbers independent of the core count.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


def check(name: str, section: str, claim: str):
    """Register a check. The function returns (measured, holds, summary); this seeds it and builds the record."""

    def register(fn):
        @functools.wraps(fn)
        def run(*args, seed: int = 0, **kwargs) -> Claim:
            with seeded(seed):
                measured, holds, summary = fn(*args, **kwargs)
            return Claim(name, claim, section, _plain(measured), bool(holds), summary)

        run.claim_name = name
        CHECKS[name] = run
        return run

    return register


def _rel_err(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |b|: 0 for equal tensors, about 1 for unrelated ones."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _fmt(xs) -> str:
    return ", ".join(f"{x:.3g}" for x in xs)


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
       "QKᵀ score variance grows in proportion to d_k; after dividing by √d_k it stays near 1")
def scaling_variance(attention: Callable = scaled_dot_product_attention, *, d_ks=SCALING_D_K):
    """``attention``: a function with qkv.scaled_dot_product_attention's signature (needs ``bias=``, ``scale=``)."""
    raw, scaled = [], []
    for d_k in d_ks:
        q, k = unit_qk(d_k)
        raw.append(float((q @ k.transpose(-2, -1)).var()) / d_k)  # (B, n, n) raw scores, spec §1.2
        scaled.append(softmax_stats(attention, q, k)["softmax_input_var"])
    holds = all(abs(r - 1) < 0.1 for r in raw) and all(abs(s - 1) < 0.1 for s in scaled)
    summary = f"var(QKᵀ)/d_k = {_fmt(raw)}; softmax-input var = {_fmt(scaled)} (d_k = {_fmt(d_ks)})"
    return {"d_k": d_ks, "raw_var_over_d_k": raw, "scaled_var": scaled}, holds, summary


@check("scaling-saturation", "§1.3",
       "without the √d_k scaling softmax saturates: near one-hot rows, vanishing gradient")
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
    summary = (f"d_k = {_fmt(d_ks)}: mean max weight {_fmt(s['max_weight'])} scaled vs {_fmt(u['max_weight'])} "
               f"unscaled; entropy {_fmt(s['entropy'])} vs {_fmt(u['entropy'])} nats; median |∂L/∂scores| "
               f"{_fmt(s['grad_median'])} vs {_fmt(u['grad_median'])}")
    return {"d_k": d_ks, **m}, holds, summary


# --- §1.4 / Q17 / Q18: what attention computes ---------------------------------------------
@check("softmax-rows", "§1.4 / Q17",
       "each row of attention weights is a probability distribution (non-negative, sums to 1)")
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
    summary = (f"min weight {min(min_w.values()):.3g}; max |row sum − 1| = {max(max_dev.values()):.2g} "
               "(plain, causal, padding)")
    return {"min_weight": min_w, "max_row_sum_error": max_dev}, holds, summary


@check("convex-combination", "§1.4", "each output row is a convex combination of the rows of V")
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
    summary = (f"max |out − W·V| = {recon:.2g}; min weight {float(w.min()):.3g}; "
               f"max |row sum − 1| = {row_dev:.2g}; max excursion outside V's range {outside:.2g}")
    return {"max_reconstruction_error": recon, "min_weight": float(w.min()), "max_row_sum_error": row_dev,
            "max_outside_value_range": outside}, holds, summary


@check("output-shape", "Q18", "the attention output has the input's shape")
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
    summary = "; ".join(f"{n}: " + ", ".join(f"{tuple(i)}→{tuple(o)}" for i, o in ps) for n, ps in pairs.items())
    return {"input_output_shapes": pairs}, holds, summary


# --- §2.2 / §2.3 / §2 tip: multi-head cost --------------------------------------------------
HEADS = (1, 2, 4, 8, 16)


@check("mha-params", "§2.2", "multi-head attention has 4·d_model² parameters whatever the number of heads h")
def mha_params(make: Callable = MultiHeadAttention, *, d_model: int = 128, heads=HEADS):
    """``make(d_model, h)`` builds the module under test."""
    counts = [sum(p.numel() for p in make(d_model, h).parameters()) for h in heads]
    expected = 4 * d_model**2
    holds = all(c == expected for c in counts)
    summary = f"d_model={d_model}, h = {_fmt(heads)}: {', '.join(map(str, counts))} parameters; 4·d² = {expected}"
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
    summary = (f"n={n}, d_model={d_model}, h = {_fmt(heads)}: {', '.join(f'{f / 1e6:.3f}' for f in fused)} MFLOP "
               f"(fused), {', '.join(f'{f / 1e6:.3f}' for f in reference)} (reference); max/min = {spread:.4f}; "
               f"8nd² + 4n²d = {formula / 1e6:.3f} M")
    return {"n": n, "d_model": d_model, "heads": heads, "flops_fused": fused, "flops_reference": reference,
            "formula": formula, "max_over_min": spread}, holds, summary


@check("heads-divisible", "§2.2 tip", "d_model not divisible by h raises a clear error")
def heads_divisible(make: Callable = MultiHeadAttention):
    """``make(d_model, h)`` must raise ValueError/TypeError naming both numbers when h does not divide d_model."""
    bad = [(10, 3), (512, 7), (768, 10)]
    good = [(512, 8), (768, 12), (1024, 16)]  # the spec's examples: paper, BERT-base, BERT-large
    errors = {}
    for d, h in bad:
        try:
            make(d, h)
            errors[f"{d}/{h}"] = "no error"
        except (ValueError, TypeError) as e:
            errors[f"{d}/{h}"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - an AssertionError or IndexError is not a clear error
            errors[f"{d}/{h}"] = f"unclear {type(e).__name__}: {e}"
    clear = all(m.startswith(("ValueError", "TypeError")) and str(d) in m and str(h) in m
                for (d, h), m in zip(bad, errors.values()))
    built = []
    for d, h in good:
        try:
            make(d, h)
            built.append(True)
        except Exception:  # noqa: BLE001
            built.append(False)
    holds = clear and all(built)
    first = next(iter(errors.values()))
    summary = f"{len(bad)} bad (d, h) pairs → {first!r} …; the spec's 512/8, 768/12, 1024/16 build: {all(built)}"
    return {"errors": errors, "valid_pairs_build": built}, holds, summary


# --- §3: position ------------------------------------------------------------------------------
def equivariance_error(f: Callable[[Tensor], Tensor], x: Tensor, perm: Tensor) -> float:
    """Relative max |f(x[:, perm]) − f(x)[:, perm]|: 0 for a permutation-equivariant f."""
    with torch.no_grad():
        return _rel_err(f(x[:, perm]), f(x)[:, perm])


def _position_variants(d: int = 32, h: int = 4, T: int = 10) -> tuple[dict, dict]:
    """(no-PE, with-PE) dicts name -> (f, input), on MultiHeadAttention and on the whole Encoder."""
    x, ids = torch.randn(2, T, d), torch.randint(0, 64, (2, T))
    sin, learned = SinusoidalPositionalEncoding(d), LearnedPositionalEmbedding(T, d)
    mha, rope_mha = MultiHeadAttention(d, h), MultiHeadAttention(d, h, rope=RotaryEmbedding(d // h))
    alibi_mha = MultiHeadAttention(d, h, alibi=ALiBi(h))

    def encoder(p):
        model = Encoder(ModelConfig(vocab_size=64, d_model=d, num_heads=h, num_layers=2, max_len=T, positional=p))
        return lambda i: model.eval()(i).last_hidden_state

    without = {"MHA": (mha, x), "Encoder": (encoder("none"), ids)}
    with_pe = {"MHA+sinusoidal": (lambda t: mha(t + sin(T)), x), "MHA+learned": (lambda t: mha(t + learned(T)), x),
               "MHA+RoPE": (rope_mha, x), "MHA+ALiBi": (alibi_mha, x)}
    with_pe.update({f"Encoder({p})": (encoder(p), ids) for p in ("sinusoidal", "learned", "rope", "alibi")})
    return without, with_pe


@check("permutation-equivariance", "§3",
       "without PE self-attention is permutation-equivariant (exactly, up to float error); sinusoidal, learned, "
       "RoPE and ALiBi break it")
def permutation_equivariance(without_pe: dict | None = None, with_pe: dict | None = None, *, broken: float = 1e-4):
    """Dicts name -> (f, x): f maps x (B, T, …) to (B, T, C); every x has the same T."""
    if without_pe is None or with_pe is None:
        default_without, default_with = _position_variants()
        without_pe = default_without if without_pe is None else without_pe
        with_pe = default_with if with_pe is None else with_pe
    T = next(iter(without_pe.values()))[1].size(1)  # every input shares this length
    perm = torch.randperm(T)
    err_without = {n: equivariance_error(f, x, perm) for n, (f, x) in without_pe.items()}
    err_with = {n: equivariance_error(f, x, perm) for n, (f, x) in with_pe.items()}
    holds = max(err_without.values()) < FLOAT_TOL and min(err_with.values()) > broken
    summary = (f"rel. error of f(x[perm]) vs f(x)[perm]: no PE {_fmt(err_without.values())} "
               f"({', '.join(err_without)}); with PE min {min(err_with.values()):.3g} over {len(err_with)} variants")
    measured = {"without_pe": err_without, "with_pe": err_with, "tolerance": FLOAT_TOL, "broken_above": broken}
    return measured, holds, summary


@check("sinusoidal-range", "§3.1 / Q10", "sinusoidal PE values lie in [-1, 1]")
def sinusoidal_range(pe: Callable | None = None, *, length: int = 4096):
    """``pe(T)`` -> (T, C)."""
    pe = SinusoidalPositionalEncoding(128) if pe is None else pe
    with torch.no_grad():
        table = pe(length)  # (T, C)
    lo, hi = float(table.min()), float(table.max())
    holds = -1 - 1e-6 <= lo and hi <= 1 + 1e-6
    summary = f"positions 0 … {length - 1}, d_model={table.size(-1)}: min {lo:.6f}, max {hi:.6f}"
    return {"length": length, "min": lo, "max": hi}, holds, summary


def pe_frequencies(pe: Callable) -> Tensor:
    """Angular frequency of each (sin, cos) pair, read off PE(1) = (sin ω_i, cos ω_i)."""
    with torch.no_grad():
        p1 = pe(torch.tensor([1]))[0].double()  # (C,)
    return torch.atan2(p1[0::2], p1[1::2])  # (C/2,)


@check("sinusoidal-wavelengths", "§3.1 / Q8",
       "sinusoidal wavelengths run from 2π (i = 0) to about 10000·2π (i = d/2 − 1)")
def sinusoidal_wavelengths(pe: Callable | None = None, *, d_model: int = 128, base: float = 10000.0):
    """``pe(positions)`` -> (…, C) with (sin, cos) pairs on (even, odd) dimensions."""
    pe = SinusoidalPositionalEncoding(d_model) if pe is None else pe
    wave = (2 * math.pi / pe_frequencies(pe)).tolist()
    ratios = [b / a for a, b in zip(wave, wave[1:])]
    step = base ** (2 / d_model)  # a geometric progression with this ratio
    last = 2 * math.pi * base ** (1 - 2 / d_model)  # exactly: the top pair is i = d/2 − 1, not d/2
    holds = (abs(wave[0] / (2 * math.pi) - 1) < 1e-4 and all(abs(r / step - 1) < 1e-3 for r in ratios)
             and abs(wave[-1] / last - 1) < 1e-3)
    summary = (f"d_model={d_model}: first {wave[0]:.5f} (2π = {2 * math.pi:.5f}), last {wave[-1]:.1f} = "
               f"{wave[-1] / (2 * math.pi * base):.3f}·10000·2π (10000^(1−2/d)·2π = {last:.1f}); "
               f"each {step:.4f}× the previous")
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
       "PE(pos + k) = R_k·PE(pos) for a fixed block rotation R_k that depends only on k")
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
    summary = (f"k = {_fmt(shifts)}, pos 0 … {length - 1}: max |PE(pos+k) − R_k·PE(pos)| = {_fmt(errors)}; "
               f"max |R_kᵀR_k − I| = {max(orth):.2g}")
    return {"shifts": shifts, "max_error": errors, "max_orthogonality_error": orth}, holds, summary


def _error_of(fn: Callable) -> str:
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - an IndexError from a table lookup is not a clear error
        return f"unclear {type(e).__name__}: {e}"
    return "no error"


@check("learned-max-len", "§3.3 / Q9",
       "learned PE has no vector beyond max_len (a clear error); sinusoidal runs at any length")
def learned_max_len(learned: Callable | None = None, sinusoidal: Callable | None = None, *, max_len: int = 16):
    """``learned(T)`` must raise a ValueError naming max_len past it; ``sinusoidal(T)`` must run far beyond."""
    learned = LearnedPositionalEmbedding(max_len, 8) if learned is None else learned
    sinusoidal = SinusoidalPositionalEncoding(8) if sinusoidal is None else sinusoidal
    inside = _error_of(lambda: learned(max_len))
    beyond = _error_of(lambda: learned(max_len + 1))
    far = 100 * max_len
    with torch.no_grad():
        table = sinusoidal(far)
    sin_ok = table.shape[0] == far and bool(torch.isfinite(table).all())
    cfg = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=1, max_len=max_len)
    ids = torch.randint(0, 32, (1, max_len + 1))
    gpt_learned = _error_of(lambda: GPT(ModelConfig(**cfg, positional="learned"))(ids))
    with torch.no_grad():
        logits = GPT(ModelConfig(**cfg, positional="sinusoidal"))(torch.randint(0, 32, (1, 4 * max_len))).logits
    clear = beyond.startswith("ValueError") and str(max_len) in beyond and gpt_learned.startswith("ValueError")
    holds = inside == "no error" and clear and sin_ok and bool(torch.isfinite(logits).all())
    summary = (f"max_len={max_len}: learned PE at {max_len + 1} positions → {beyond!r}; sinusoidal PE at {far} "
               f"positions finite: {sin_ok}; GPT(sinusoidal) at {4 * max_len} tokens runs")
    return {"learned_at_max_len": inside, "learned_beyond": beyond, "gpt_learned_beyond": gpt_learned,
            "sinusoidal_length": far, "sinusoidal_finite": sin_ok,
            "gpt_sinusoidal_finite": bool(torch.isfinite(logits).all())}, holds, summary


# --- Q12 / Q5 / Q16: masks, symmetry, attending to oneself --------------------------------
def future_gradient(f: Callable[[Tensor], Tensor], x: Tensor) -> tuple[float, float]:
    """(max |∂f(x)_t / ∂x_s| over s > t, min over t of ‖∂f(x)_t / ∂x_{≤t}‖) for x (1, T, C)."""
    future, past = 0.0, math.inf
    for t in range(x.size(1)):
        xi = x.detach().clone().requires_grad_(True)
        f(xi)[0, t].sum().backward()
        future = max(future, float(xi.grad[0, t + 1:].abs().max()) if t + 1 < x.size(1) else 0.0)
        past = min(past, float(xi.grad[0, : t + 1].norm()))
    return future, past


def _gpt_on_embeddings(model: GPT, ids: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """(f, e): the GPT's embedding output e (B, T, C) for ids, and f(e') = its logits with e' in place of e."""
    seen = []
    handle = model.embed.register_forward_hook(lambda m, inputs, out: seen.append(out.detach()))
    with torch.no_grad():
        model(ids)
    handle.remove()

    def f(e: Tensor) -> Tensor:
        handle = model.embed.register_forward_hook(lambda m, inputs, out: e)
        try:
            return model(ids).logits
        finally:
            handle.remove()

    return f, seen[0]


@check("causal-no-future", "Q12", "a causal mask lets no information flow from the future (zero gradient)")
def causal_no_future(causal: dict | None = None):
    """``causal``: name -> (f, x) with x (1, T, C); output t must not depend on inputs after t."""
    if causal is None:
        mha = MultiHeadAttention(16, 4)
        gpt = GPT(ModelConfig(vocab_size=32, d_model=16, num_heads=4, num_layers=2, max_len=16)).eval()
        ids = torch.randint(0, 32, (1, 8))
        causal = {
            "MHA (fused)": (lambda x: mha(x, is_causal=True), torch.randn(1, 8, 16)),
            "MHA (reference)": (lambda x: mha(x, is_causal=True, return_weights=True)[0], torch.randn(1, 8, 16)),
            "GPT": _gpt_on_embeddings(gpt, ids),
        }
    grads = {name: future_gradient(f, x) for name, (f, x) in causal.items()}
    holds = all(fut == 0.0 and past > 0 for fut, past in grads.values())
    summary = "; ".join(f"{n}: max future grad {fut:.3g}, min past grad norm {past:.3g}"
                        for n, (fut, past) in grads.items())
    return {n: {"max_future_grad": fut, "min_past_grad_norm": past} for n, (fut, past) in grads.items()}, holds, summary


@check("scores-not-symmetric", "Q5", "attention scores QKᵀ are not symmetric (W_Q and W_K are learned separately)")
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
    summary = f"‖S − Sᵀ‖/‖S‖ = {asym:.3g}; softmax(S) matches the module's weights to {match:.2g}"
    return {"relative_asymmetry": asym, "weights_match": match}, holds, summary


@check("attends-to-itself", "Q16", "a token attends to itself with non-zero weight")
def attends_to_itself(weights: dict | None = None):
    """``weights``: name -> a function returning (…, T, T) attention weights."""
    if weights is None:
        sa = SelfAttention(16)
        gpt = GPT(ModelConfig(vocab_size=32, d_model=16, num_heads=4, num_layers=2, max_len=16)).eval()
        ids = torch.randint(0, 32, (2, 8))
        weights = {"SelfAttention": lambda: sa(torch.randn(2, 8, 16), return_weights=True)[1],
                   "GPT (causal)": lambda: torch.stack(gpt(ids, return_attention=True).attentions)}
    diag = {}
    with torch.no_grad():
        for name, fn in weights.items():
            w = fn()  # (..., T, T)
            d = torch.diagonal(w, dim1=-2, dim2=-1)  # (..., T)
            allowed = (w > 0).sum(-1)  # (..., T): keys each query may see (all, or ≤ itself under a causal mask)
            diag[name] = {"min_self_weight": float(d.min()), "self_over_uniform": float((d * allowed).mean())}
    holds = all(v["min_self_weight"] > 0 for v in diag.values())
    summary = "; ".join(f"{n}: min self-weight {v['min_self_weight']:.3g}, mean {v['self_over_uniform']:.3g}× "
                        "a uniform row's" for n, v in diag.items())
    return diag, holds, summary


# --- Q3: heads of a trained model (needs --run) ----------------------------------------------
def head_distances(model: nn.Module, ids: Tensor) -> Tensor:
    """Mean pairwise total-variation distance between heads' attention rows, per layer: (layers,).

    TV(p, q) = ½ Σ|p − q| per query row, averaged over rows, batch and the H(H−1)/2 head pairs.
    """
    with torch.no_grad():
        att = torch.stack(model(ids.to(next(model.parameters()).device), return_attention=True).attentions)
    att = att.float().cpu()  # (N, B, H, T, T)
    H = att.size(2)
    tv = 0.5 * (att[:, :, :, None] - att[:, :, None, :]).abs().sum(-1)  # (N, B, H, H, T)
    pairs = torch.triu(torch.ones(H, H, dtype=torch.bool), diagonal=1)  # (H, H), i < j
    return tv.mean(dim=(1, 4))[:, pairs].mean(-1)  # (N,)


def head_diversity(trained: nn.Module, ids: Tensor, *, initial: nn.Module | None = None, seed: int = 0) -> Claim:
    """Q3: trained heads attend differently, measured against the same architecture at initialisation."""
    with seeded(seed):
        if initial is None:
            initial = type(trained)(trained.config).to(next(trained.parameters()).device).eval()
        t, i = head_distances(trained, ids), head_distances(initial, ids)
    holds = bool(t.mean() > 2 * i.mean() and t.mean() > 0.05)
    summary = (f"mean pairwise TV distance between heads, per layer: trained {_fmt(t.tolist())} vs init "
               f"{_fmt(i.tolist())} (on {ids.numel()} tokens)")
    measured = {"trained_per_layer": t, "init_per_layer": i, "trained_mean": t.mean(), "init_mean": i.mean(),
                "tokens": ids.numel()}
    return Claim("head-diversity", "the heads of a trained model attend differently (against the same model at init)",
                 "Q3", _plain(measured), holds, summary)


def encode_text(tokenizer, text: str, *, max_len: int) -> tuple[Tensor, list[str]]:
    """text -> (ids (T,), one label per token); ValueError for empty text, unknown characters or T > max_len."""
    if not text:
        raise ValueError("the text is empty; give at least one character")
    ids = tokenizer.encode(text)  # ValueError for characters outside the vocabulary
    if len(ids) > max_len:
        raise ValueError(f"the text is {len(ids)} tokens but the model's max_len is {max_len}; shorten it")
    return torch.tensor(ids, dtype=torch.long), tokenizer.token_strings(ids)


def validation_text(run_dir) -> str:
    """The validation split of the corpus the run was trained on (train_config.json's data; default corpus)."""
    from ..data import load_corpus

    cfg_path = Path(run_dir) / "train_config.json"
    data = None
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        data = cfg.get("data") if isinstance(cfg, dict) else None
    if data and not Path(data).exists():
        raise ValueError(f"{run_dir} was trained on {data}, which is not there any more; pass --text")
    return load_corpus(data or None).val


def run_text_ids(run, text: str | None = None, *, windows: int = 4, length: int = 128) -> Tensor:
    """(W, T) token ids for the head-diversity claim: ``text``, or W windows of the run's validation text.

    T = min(length, max_len). Windows come from evenly spaced offsets; a window holding a
    character the tokenizer lacks (possible with a character vocabulary) is skipped.
    """
    max_len = run.model.config.max_len
    if text is not None:
        return encode_text(run.tokenizer, text, max_len=max_len)[0][None]  # (1, T)
    T, val = min(length, max_len), validation_text(run.path)
    rows, chunk = [], 8 * T  # characters per attempt: enough for T tokens of any tokenizer here
    for start in range(0, max(1, len(val) - chunk), max(1, (len(val) - chunk) // (4 * windows))):
        try:
            ids = run.tokenizer.encode(val[start:start + chunk])
        except ValueError:
            continue
        if len(ids) >= T:
            rows.append(ids[:T])
        if len(rows) == windows:
            break
    if not rows:
        raise ValueError(f"no {T}-token window of {run.path}'s validation text fits its tokenizer; pass --text")
    return torch.tensor(rows, dtype=torch.long)


# --- corrections: the spec's own code beside the right one -----------------------------------
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
       "the spec's §2.1 snippet gives (n, h, h) scores, not (h, n, n); the heads must be moved first")
def spec_scores_shape(mha: nn.Module | None = None, *, n: int = 6, d_model: int = 32, h: int = 4):
    """``mha``: a MultiHeadAttention-like module; its output must match the corrected §2.1 logic."""
    mha = MultiHeadAttention(d_model, h) if mha is None else mha
    X = torch.randn(n, d_model)
    with torch.no_grad():
        spec_s, spec_out = spec_mha_scores(mha, X)
        right_s, right_out = correct_mha_scores(mha, X)
        module_out = mha(X[None])[0]  # (n, d_model): the module under test
    spec_err, right_err = _rel_err(spec_out, module_out), _rel_err(right_out, module_out)
    holds = (tuple(spec_s.shape) == (n, h, h) and tuple(right_s.shape) == (h, n, n)
             and right_err < FLOAT_TOL and spec_err > 1e-2 and tuple(spec_out.shape) == (n, d_model))
    summary = (f"n={n}, h={h}: spec scores {tuple(spec_s.shape)}, correct {tuple(right_s.shape)}; "
               f"both outputs are {tuple(spec_out.shape)}, so the bug passes shape checks; rel. error vs "
               f"qkv.MultiHeadAttention: spec {spec_err:.3g}, correct {right_err:.2g}")
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
       "permuting the input can")
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
    summary = (f"狗咬人 vs 人咬狗: spec check (no PE, PE) = ({spec['no PE']}, {spec['PE']}) — the spec prints "
               f"(True, False); permutation test = ({perm['no PE']}, {perm['PE']})")
    return {"spec_check": spec, "permutation_test": perm, "spec_expected": {"no PE": True, "PE": False}}, holds, summary


@check("spec-q2-packed-projection", "Q2 (correction)",
       "nn.MultiheadAttention holds one packed in_proj_weight (3d × d) plus out_proj, not four separate nn.Linear")
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
            measured["qkv_split_rel_error"] = _rel_err(split, module(x, x, x, need_weights=False)[0])
        holds = holds and measured["qkv_split_rel_error"] < FLOAT_TOL
    summary = (f"parameters {', '.join(f'{n} {tuple(s)}' for n, s in params.items())}; nn.Linear submodules: "
               f"{linears or 'none'}" + (f"; split into 4 projections it equals qkv's MHA to "
                                         f"{measured['qkv_split_rel_error']:.2g}" if packed else ""))
    return measured, holds, summary


# --- running and printing ----------------------------------------------------------------------
RUN_CLAIMS = ("head-diversity",)  # need a trained model (`qkv verify --run DIR`)


def claim_names() -> list[str]:
    return list(CHECKS) + list(RUN_CLAIMS)


def resolve_names(only: list[str] | None) -> list[str] | None:
    """Comma-separated or repeated names -> list; ValueError naming the unknown ones."""
    if not only:
        return None
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in claim_names()]
    if unknown or not names:
        raise ValueError(f"unknown claim {', '.join(map(repr, unknown)) or repr('')}; "
                         f"choose from: {', '.join(claim_names())}")
    return names


def run_claims(names: list[str] | None = None, *, model: nn.Module | None = None, ids: Tensor | None = None,
               seed: int = 0) -> list[Claim]:
    """Run the named checks (all by default; head-diversity when a trained ``model`` and ``ids`` are given)."""
    wanted = claim_names() if names is None else names
    if model is None and names is not None and "head-diversity" in names:
        raise ValueError("claim 'head-diversity' needs a trained model: pass --run DIR")
    results = [fn(seed=seed) for n, fn in CHECKS.items() if n in wanted]  # in the spec's order
    if model is not None and "head-diversity" in wanted:
        results.append(head_diversity(model, ids, seed=seed))
    return results


def format_table(results: list[Claim], *, width: int = 100) -> str:
    """A text table: one line per claim (result, section, claim), the measured numbers wrapped beneath."""
    import textwrap

    lines = [f"{'result':<7} {'section':<19} claim", "-" * width]
    for r in results:
        lines.append(f"{'holds' if r.holds else 'FAILS':<7} {r.section:<19} {r.claim}  [{r.name}]")
        lines += textwrap.wrap(r.summary, width=width, initial_indent=" " * 8, subsequent_indent=" " * 10)
    failed = [r.name for r in results if not r.holds]
    lines.append("-" * width)
    lines.append(f"{len(results) - len(failed)} of {len(results)} claims hold" +
                 (f"; failing: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def format_markdown(results: list[Claim], figures: dict[str, str] | None = None) -> str:
    """A Markdown report: the table, then each figure (caption -> relative PNG path)."""

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    held = sum(r.holds for r in results)
    lines = ["# qkv verify: the spec's claims, measured", "",
             f"{held} of {len(results)} claims hold. Produced by `qkv verify --markdown`; every number below is "
             "measured on qkv's own modules (seeded, CPU).", "",
             "| claim | section | measured | holds |", "|---|---|---|---|"]
    lines += [f"| {cell(r.claim)} (`{r.name}`) | {cell(r.section)} | {cell(r.summary)} | "
              f"{'✅ holds' if r.holds else '❌ fails'} |" for r in results]
    for caption, path in (figures or {}).items():
        lines += ["", f"## {caption}", "", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"
