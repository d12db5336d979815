"""OLMo 2 (OLMo et al. 2024): LLaMA whose norms come after each sublayer instead of before it — x + Norm(Attn(x)),
x + Norm(MLP(x)), ``normalization.post_sublayer`` — with QK-norm over the whole q and k projections (one RMSNorm
over H·D and one over G·D, ``attention.qk_norm_scope = "projection"``), before RoPE.

    post_attention_layernorm    the norm after attention (qkv: attn_norm)
    post_feedforward_layernorm  the norm after the MLP (qkv: ff_norm)
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import tied_head
from ..settings import expect_no_mlp_bias
from . import llama

DEFAULTS = dict(rms_norm_eps=1e-5, tie_word_embeddings=False)


def config(hf: dict, problems: list[str]) -> dict:
    """Olmo2Config -> ModelConfig arguments."""
    out = llama.config({**DEFAULTS, **hf, "mlp_bias": False}, problems)
    return out | dict(attention=out["attention"] | dict(qk_norm=True, qk_norm_scope="projection"),
                      normalization=out["normalization"] | dict(first=False, post_sublayer=True))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Olmo2Config fields."""
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (OLMo 2's attention_bias sets all four)")
    expect_no_mlp_bias(c, problems, "OLMo2")
    if not (a.qk_norm and a.qk_norm_scope == "projection"):
        problems.append(f"attention.qk_norm={a.qk_norm}, qk_norm_scope={a.qk_norm_scope!r} (OLMo 2 normalises the "
                        "whole q and k projections: True, 'projection')")
    fields = llama.decoder_export(c, problems, "OLMo2", allowed=(
        "normalization.post_sublayer", "attention.qk_norm", "attention.qk_norm_scope"))
    fields.pop("mlp_bias")
    return fields | dict(attention_bias=a.q_bias)


FAMILY = Family(
    model_type="olmo2", name="OLMo2", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("Olmo2Config", "Olmo2ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"), ("normalization.post_sublayer", True)),
)
