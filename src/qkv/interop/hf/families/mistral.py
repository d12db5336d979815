"""Mistral (Jiang et al. 2023): LLaMA with a sliding window of ``sliding_window`` keys in every layer (None:
none), and no attention or MLP bias."""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family, Not
from ..rules import tied_head
from ..settings import expect_no_mlp_bias, read_layer_types
from . import llama


def config(hf: dict, problems: list[str]) -> dict:
    """MistralConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    out = llama.config({**hf, "attention_bias": False, "mlp_bias": False}, problems)
    n = hf.get("num_hidden_layers", 32)
    window, _ = read_layer_types({**hf, "layer_types": None}, problems,
                                 ["sliding_attention" if hf.get("sliding_window") is not None else "full_attention"] * n)
    return out | dict(attention=out["attention"] | dict(sliding_window=window))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> MistralConfig fields."""
    if any(c.attention.biases):
        problems.append(f"attention biases (q, k, v, out) = {c.attention.biases} (Mistral has none)")
    expect_no_mlp_bias(c, problems, "Mistral")
    if c.layer_types and set(c.layer_types) != {"sliding_attention"}:
        problems.append(f"layer_types={sorted(set(c.layer_types))} (Mistral slides in every layer)")
    fields = llama.decoder_export(c, problems, "Mistral", allowed=("attention.sliding_window", "layer_types"))
    return fields | dict(sliding_window=c.attention.sliding_window)


FAMILY = Family(
    model_type="mistral", name="Mistral", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("MistralConfig", "MistralForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"), ("attention.qk_norm", False),
                 ("attention.biases", (False, False, False, False)), ("attention.sliding_window", Not(None))),
)
