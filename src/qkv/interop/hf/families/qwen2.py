"""Qwen2 / Qwen2.5 (Qwen team 2024): LLaMA with a bias on q/k/v (not o_proj), and sliding layers from
``use_sliding_window``: layer i slides when i ≥ ``max_window_layers`` (or as 5.x's ``layer_types`` lists them)."""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import tied_head
from ..settings import expect_no_mlp_bias, export_layer_types, read_layer_types, require
from . import llama

QWEN_BIASES = dict(q_bias=True, k_bias=True, v_bias=True, out_bias=False)


def qwen_layers(hf: dict, problems: list[str]) -> dict:
    """attention.sliding_window and layer_types of Qwen2/Qwen3's use_sliding_window / max_window_layers."""
    n, first = hf.get("num_hidden_layers", 32), hf.get("max_window_layers", 28)
    slides = hf.get("use_sliding_window", False)
    default = ["sliding_attention" if slides and i >= first else "full_attention" for i in range(n)]
    window, types = read_layer_types(hf, problems, default)
    return dict(sliding_window=window), dict(layer_types=types)


def config(hf: dict, problems: list[str]) -> dict:
    """Qwen2Config (4.x or 5.x spelling) -> ModelConfig arguments."""
    require(hf, problems, num_experts=None)
    out = llama.config({**hf, "attention_bias": False}, problems)
    window, types = qwen_layers(hf, problems)
    return out | types | dict(attention=out["attention"] | QWEN_BIASES | window)


def export_layers(c: ModelConfig) -> dict:
    """Qwen's sliding settings: every layer's type (5.x reads layer_types; 4.x the max_window_layers rule)."""
    types = export_layer_types(c)
    if "sliding_attention" not in types:
        return dict(use_sliding_window=False, sliding_window=None, layer_types=types)
    return dict(use_sliding_window=True, sliding_window=c.attention.sliding_window, layer_types=types,
                max_window_layers=types.index("sliding_attention"))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Qwen2Config fields."""
    a = c.attention
    if a.biases != (True, True, True, False):
        problems.append(f"attention biases (q, k, v, out) = {a.biases} (Qwen2 has (True, True, True, False))")
    expect_no_mlp_bias(c, problems, "Qwen2")
    fields = llama.decoder_export(c, problems, "Qwen2", allowed=("attention.sliding_window", "layer_types"))
    return fields | export_layers(c)


FAMILY = Family(
    model_type="qwen2", name="Qwen2", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("Qwen2Config", "Qwen2ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"), ("attention.qk_norm", False),
                 ("attention.biases", (True, True, True, False)), ("feed_forward.bias", False)),
)
