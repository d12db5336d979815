"""YaRN as llama.cpp runs it, against what transformers (and qkv) compute from the same ``rope_parameters``.

    ramp     ggml_rope_yarn_corr_dims rounds the ramp's ends outwards (floor, ceil), as HF's truncate=True; no GGUF
             key or graph says otherwise. gpt-oss's released configs (truncate=False) run in llama.cpp that way (its
             accepted approximation, the official gpt-oss GGUFs included): written rounded, with a warning giving the
             largest relative change of a rotary frequency and the drift of its angle; elsewhere refused
    betas    llama.cpp's gpt-oss and deepseek2 loaders read no yarn_beta_* key: β_fast 32, β_slow 1 (llama_hparams'
             defaults), others refused; the keys are written as convert_hf_to_gguf.py writes them
    scales   llama_context's cos/sin factor a: 1 + 0.1 ln s, or 1 where rope.scaling.yarn_log_multiplier is set
             (deepseek2, written 0.1 · mscale_all_dim, read back ÷ 0.1: llama.cpp takes mscale = mscale_all_dim);
             deepseek2's kq_scale × (a · (1 + 0.1 · mscale_all_dim · ln s))². transformers: cos/sin × attention_factor,
             else mscale(s, mscale) / mscale(s, mscale_all_dim) where both are set, else 1 + 0.1 ln s; DeepSeek's
             scores × mscale(s, mscale_all_dim)². A config where the two pairs differ is refused.

s is ``factor``, L₀ ``original_max_position_embeddings``; a pair is one rotated (2i, 2i+1) of d rotated dims.
"""
from __future__ import annotations

import dataclasses
import math

from ...nn.latent_attention import latent_softmax_scale
from ...nn.rope_scaling import RopeScaling, plain_inv_freq, yarn_attention_factor, yarn_mscale, yarn_ramp
from ..hf.settings import read_rope_scaling, rope_parameters

BETAS = (32.0, 1.0)  # llama_hparams' yarn_beta_fast, yarn_beta_slow: what gpt-oss and deepseek2 run


def yarn_scaling(hf: dict) -> RopeScaling:
    """The HF config's YaRN as qkv reads it (L₀ and s filled in as transformers fills them)."""
    return RopeScaling.from_dict(read_rope_scaling(rope_parameters(hf, []), hf, []))


def llama_cpp_scales(s: RopeScaling, latent: bool) -> tuple[float, float]:
    """(cos/sin factor, scores' multiplier) in llama.cpp: llama_context's yarn_attn_factor (ggml's rope_yarn
    multiplies back the 1 + 0.1 ln s it divides out) and, with ``latent`` (deepseek2), its kq_scale correction."""
    log_mul = (s.mscale_all_dim or 0.0) if latent else 0.0  # only deepseek2's converter writes it
    a = 1.0 if log_mul else yarn_mscale(s.factor)
    return a, (a * (1 + 0.1 * log_mul * math.log(s.factor))) ** 2 if latent else 1.0


def hf_scales(s: RopeScaling, latent: bool) -> tuple[float, float]:
    """(cos/sin factor, scores' multiplier) in transformers: the attention factor; DeepSeek's mscale² (``latent``)."""
    return yarn_attention_factor(s), latent_softmax_scale(1, s) if latent else 1.0


def yarn_problems(name: str, s: RopeScaling, *, latent: bool, unrounded: bool) -> list[str]:
    """What llama.cpp's ``name`` would compute otherwise from YaRN ``s``; truncate=False only where ``unrounded``
    (written rounded, with ``ramp_warning``)."""
    out = []
    if not s.truncate and not unrounded:
        out.append(f"YaRN truncate=False (llama.cpp's {name} rounds the ramp's ends to whole dims: truncate=True)")
    betas = (s.beta_fast or BETAS[0], s.beta_slow or BETAS[1])
    if betas != BETAS:
        out.append(f"YaRN beta_fast={betas[0]}, beta_slow={betas[1]} (llama.cpp's {name} reads no β: "
                   f"{BETAS[0]} and {BETAS[1]})")
    ours, theirs = hf_scales(s, latent), llama_cpp_scales(s, latent)
    if not all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(ours, theirs)):
        given = [f"{k}={getattr(s, k)}" for k in ("factor", "attention_factor", "mscale", "mscale_all_dim")
                 if getattr(s, k) is not None]
        out.append(f"YaRN {', '.join(given)}: cos/sin × {ours[0]:.6g}, scores × {ours[1]:.6g} (llama.cpp's {name} "
                   f"makes them × {theirs[0]:.6g} and × {theirs[1]:.6g}"
                   + (": its mscale is mscale_all_dim, its scores' correction (1 + 0.1 · mscale_all_dim · ln s)²)"
                      if latent else ": 1 + 0.1 ln s on cos/sin, nothing on the scores)"))
    return out


def rounded_ramp_change(dims: int, base: float, s: RopeScaling) -> tuple[float, int, float]:
    """(the largest relative change |θ'ᵣ − θ'| / θ' of a rotary frequency when the ramp's ends are rounded, its
    pair, the largest |θ'ᵣ − θ'| in radians per position)."""
    def mixed(ramp):  # θ'_i = (1 − γ_i)·θ_i + γ_i·θ_i / s
        return plain_inv_freq(dims, base).double() * (1 - ramp + ramp / s.factor)
    exact = mixed(yarn_ramp(dims, base, s))
    rounded = mixed(yarn_ramp(dims, base, dataclasses.replace(s, truncate=True)))
    relative = (rounded - exact).abs() / exact  # (d/2,)
    return relative.max().item(), int(relative.argmax()), (rounded - exact).abs().max().item()


def ramp_warning(name: str, dims: int, base: float, s: RopeScaling, context: int) -> str | None:
    """What writing truncate=False's unrounded ramp rounded does to the rotary frequencies; None: nothing."""
    relative, pair, drift = rounded_ramp_change(dims, base, s)
    if relative == 0:
        return None
    top = s.original_max_position_embeddings
    return (f"{name}: YaRN truncate=False is written with the ramp's ends rounded to whole dims, as llama.cpp runs "
            f"{name} (ggml_rope_yarn_corr_dims rounds them; no GGUF key says otherwise): the rotary frequency of "
            f"pair {pair} of {dims // 2} changes by {100 * relative:.3g}% (the largest change), and a rotated angle "
            f"drifts by up to {drift * top:.3g} rad at position {top} and {drift * context:.3g} rad at position "
            f"{context}; llama.cpp's logits differ from transformers' accordingly, more with distance")


def write_yarn(writer, s: RopeScaling, *, latent: bool) -> None:
    """YaRN's keys as convert_hf_to_gguf.py writes them: factor, L₀, β bounds; deepseek2's 0.1 · mscale_all_dim."""
    writer.add_rope_scaling_factor(float(s.factor))
    writer.add_rope_scaling_orig_ctx_len(int(s.original_max_position_embeddings))
    writer.add_rope_scaling_yarn_beta_fast(float(s.beta_fast or BETAS[0]))
    writer.add_rope_scaling_yarn_beta_slow(float(s.beta_slow or BETAS[1]))
    if latent and s.mscale_all_dim is not None:  # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: llama.cpp divides by 0.1
        writer.add_rope_scaling_yarn_log_mul(0.1 * s.mscale_all_dim)
