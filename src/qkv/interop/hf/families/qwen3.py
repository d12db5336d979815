"""Qwen3 (Qwen team 2025): LLaMA with QK-norm (RMSNorm over each head's q and k before RoPE) and a head_dim
apart from hidden_size / heads; sliding layers as Qwen2's (``use_sliding_window``, ``max_window_layers``)."""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import tied_head
from ..settings import expect_no_mlp_bias, require
from . import llama, qwen2


def config(hf: dict, problems: list[str]) -> dict:
    """Qwen3Config (4.x or 5.x spelling) -> ModelConfig arguments."""
    require(hf, problems, num_experts=None)
    out = llama.config(hf, problems)
    window, types = qwen2.qwen_layers(hf, problems)
    return out | types | dict(attention=out["attention"] | window | dict(qk_norm=True))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Qwen3Config fields."""
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (Qwen3's attention_bias sets all four)")
    expect_no_mlp_bias(c, problems, "Qwen3")
    allowed = ("attention.qk_norm", "attention.sliding_window", "layer_types")
    fields = llama.decoder_export(c, problems, "Qwen3", allowed=allowed)
    return fields | qwen2.export_layers(c) | dict(attention_bias=a.q_bias)


FAMILY = Family(
    model_type="qwen3", name="Qwen3", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("Qwen3Config", "Qwen3ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"), ("attention.qk_norm", True)),
)
