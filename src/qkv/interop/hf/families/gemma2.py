"""Gemma 2 (Gemma Team 2024): LLaMA with (1 + w) RMSNorm four times a block (before and after attention and
the MLP), a GeGLU (tanh) MLP, embeddings × √C rounded to their dtype, queries scaled by
``query_pre_attn_scalar``^-½, soft caps on the attention scores and the logits, a tied head, and sliding layers
from ``layer_types`` (4.x: even layers slide, odd ones are global)."""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import tied_head
from ..settings import expect_no_mlp_bias, export_layer_types, read_layer_types, require, rope_base_and_scaling
from . import llama

ALLOWED = ("attention.query_scalar", "attention.softcap", "attention.sliding_window", "layer_types",
           "normalization.sandwich", "embedding.scale_in_dtype", "head.softcap")  # decoder_export's variants


def config(hf: dict, problems: list[str]) -> dict:
    """Gemma2Config (4.x or 5.x spelling) -> ModelConfig arguments."""
    require(hf, problems, use_bidirectional_attention=None)
    hf = {**hf, "mlp_bias": False, "hidden_activation": hf.get("hidden_activation", "gelu_pytorch_tanh")}
    out = llama.decoder_config(hf, problems, *rope_base_and_scaling(hf, problems), activation="hidden_activation")
    n = hf.get("num_hidden_layers", 26)
    window, types = read_layer_types(hf, problems, ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                    for i in range(n)])
    attention = out["attention"] | dict(query_scalar=hf.get("query_pre_attn_scalar", 256), sliding_window=window,
                                        softcap=hf.get("attn_logit_softcapping"))
    return out | dict(
        attention=attention, layer_types=types,
        normalization=out["normalization"] | dict(kind="rmsnorm_plus_one", sandwich=True),
        embedding=dict(scale=True, scale_in_dtype=True),
        head=dict(tie=hf.get("tie_word_embeddings", True), softcap=hf.get("final_logit_softcapping")))


def expect_gemma_blocks(c: ModelConfig, problems: list[str], family: str = "Gemma2") -> None:
    """What every Gemma 2 (and 3) model has: the four norms a block, embeddings scaled in their dtype, no bias apart."""
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ ({family}'s attention_bias sets all four)")
    expect_no_mlp_bias(c, problems, family)
    if not c.normalization.sandwich:
        problems.append(f"normalization.sandwich=False ({family} norms before and after attention and the MLP)")
    if not (c.embedding.scale and c.embedding.scale_in_dtype):
        problems.append(f"embedding.scale={c.embedding.scale!r}, scale_in_dtype={c.embedding.scale_in_dtype!r} "
                        f"({family} scales embeddings by √d_model rounded to their dtype: both True)")


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Gemma2Config fields."""
    expect_gemma_blocks(c, problems)
    fields = llama.decoder_export(c, problems, "Gemma2", norm="rmsnorm_plus_one", allowed=ALLOWED,
                                  activation="hidden_activation", prefer=("gelu_pytorch_tanh",))
    a = c.attention
    return fields | dict(
        attention_bias=a.q_bias, query_pre_attn_scalar=a.query_scalar or c.head_dim, attn_logit_softcapping=a.softcap,
        final_logit_softcapping=c.head.softcap, sliding_window=a.sliding_window, layer_types=export_layer_types(c))


FAMILY = Family(
    model_type="gemma2", name="Gemma2", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("Gemma2Config", "Gemma2ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm_plus_one")),
)
