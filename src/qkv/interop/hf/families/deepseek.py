"""DeepSeek-V2 (arXiv 2405.04434) and DeepSeek-V3 (arXiv 2412.19437), dense layers only: LLaMA's blocks (RMSNorm,
SwiGLU, RoPE, an untied head) with multi-head latent attention (``qkv.nn.MultiHeadLatentAttention``, the same
weight names: q_proj or q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).

What differs between the two, as transformers 5 models them:

    V2   RoPE on interleaved pairs always (complex rotation); an MLP bias setting (mlp_bias); MoE from layer
         first_k_dense_replace (default 0: every layer), n_routed_experts 64
    V3   rope_interleave (default True) chooses interleaved pairs or halves; no MLP bias; first_k_dense_replace
         default 3, n_routed_experts 256

Interleaved RoPE: Hugging Face rotates pairs (2i, 2i+1) and writes the rotated dims half-split, one permutation
of q_R and k_R alike that no score sees; qkv's interleaved RoPE leaves them in place, so no row is permuted.
YaRN (rope_scaling / rope_parameters, with DeepSeek's mscale and mscale_all_dim) is ``position.scaling``; its
softmax-scale correction is ``qkv.nn.latent_attention.latent_softmax_scale``.
A layer from first_k_dense_replace on is a mixture of experts unless n_routed_experts is None (transformers
builds one there whatever moe_layer_freq says): qkv refuses those, naming them. ``to_hf`` writes V3 (V2 for a
model with an MLP bias), every layer dense (first_k_dense_replace = num_hidden_layers).
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import Rule, embedding_and_head, same, tied_head
from ..settings import expect_no_mlp_bias, rope_base_and_scaling, rope_parameters, uniform_biases
from . import llama

# HF's defaults, which V2 and V3 share: the attention section's widths
LATENT = dict(kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
DENSE = "qkv loads DeepSeek checkpoints whose every layer is dense"


def moe_problem(hf: dict, experts_default: int, first_default: int) -> str | None:
    """The layers transformers builds as mixture-of-experts (from first_k_dense_replace on, where n_routed_experts
    is set), named; None when every layer is dense."""
    n, experts = hf.get("num_hidden_layers", 32), hf.get("n_routed_experts", experts_default)
    first = hf.get("first_k_dense_replace", first_default)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        return f"first_k_dense_replace={first!r} (expected a number of dense layers, ≥ 0)"
    if experts is None or not isinstance(n, int) or first >= n:
        return None
    layers = f"layer {first} is" if first == n - 1 else f"layers {first}–{n - 1} are"
    return f"{layers} mixture-of-experts (n_routed_experts={experts}); {DENSE}"


def latent_config(hf: dict, problems: list[str], *, interleaved: bool, experts: int, first_dense: int) -> dict:
    """A DeepSeek config (4.x or 5.x spelling) -> ModelConfig arguments; what differs between V2 and V3 is
    passed: the RoPE pair layout and the MoE defaults."""
    heads = hf.get("num_attention_heads", 32)
    if hf.get("num_key_value_heads") not in (None, heads):
        problems.append(f"num_key_value_heads={hf['num_key_value_heads']!r} with {heads} heads (multi-head latent "
                        "attention has a key and value per head: num_key_value_heads = num_attention_heads)")
    moe = moe_problem(hf, experts, first_dense)
    problems += [moe] if moe else []
    rope = rope_parameters(hf, [])  # its problems are rope_base_and_scaling's, listed once
    if rope["rope_type"] not in ("default", "yarn") and rope.get("mscale_all_dim"):
        problems.append(f"mscale_all_dim={rope['mscale_all_dim']!r} with RoPE scaling {rope['rope_type']!r} is not "
                        "supported (qkv scales DeepSeek's scores by mscale² with yarn only)")
    out = llama.decoder_config(hf, problems, *rope_base_and_scaling(hf, problems))
    attention = dict(kind="mla", num_heads=heads, **{k: hf.get(k, v) for k, v in LATENT.items()},
                     **uniform_biases(hf.get("attention_bias", False)))
    return out | dict(attention=attention, position=out["position"] | dict(interleaved=interleaved))


def config_v3(hf: dict, problems: list[str]) -> dict:
    """DeepseekV3Config -> ModelConfig arguments: rope_interleave chooses the pairs; the MLP has no bias."""
    return latent_config({**hf, "mlp_bias": False}, problems, interleaved=bool(hf.get("rope_interleave", True)),
                         experts=256, first_dense=3)


def config_v2(hf: dict, problems: list[str]) -> dict:
    """DeepseekV2Config -> ModelConfig arguments: interleaved pairs always; mlp_bias as given."""
    return latent_config(hf, problems, interleaved=True, experts=64, first_dense=0)


def attention_weights(c: ModelConfig) -> list[tuple[str, bool]]:
    """MLA's modules (Hugging Face's names, qkv's alike) and whether each has a bias (attention_bias: q_a, kv_a, o)."""
    b = c.attention.out_bias
    query = [("q_proj", False)] if c.attention.q_lora_rank is None else \
        [("q_a_proj", b), ("q_a_layernorm", False), ("q_b_proj", False)]
    return query + [("kv_a_proj_with_mqa", b), ("kv_a_layernorm", False), ("kv_b_proj", False), ("o_proj", b)]


def rules(c: ModelConfig) -> list[Rule]:
    """The weight table: LLaMA's embedding, norms and MLP, MLA's projections; every tensor as it is."""
    out = embedding_and_head(c, "embed_tokens.weight") + [same("norm.weight", "final_norm.weight")]
    modules = [(f"self_attn.{name}", f"attn.{name}", bias) for name, bias in attention_weights(c)]
    modules += [(f"mlp.{name}", f"ff.{name}", c.feed_forward.bias) for name in llama.MLP]
    modules += [(hf, q, False) for hf, q in llama.NORMS]
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        out += [same(f"{l}{hf}.{p}", f"{b}{q}.{p}") for hf, q, bias in modules
                for p in (("weight", "bias") if bias else ("weight",))]
    return out


def latent_export(c: ModelConfig, problems: list[str], family: str) -> dict:
    """The HF config fields V2 and V3 share: LLaMA's (no head_dim, no mlp_bias), MLA's widths, every layer dense."""
    fields = llama.decoder_export(c, problems, family, allowed=("attention.kind",))
    for name in ("head_dim", "mlp_bias"):  # HF sets head_dim = qk_rope_head_dim; V3 has no mlp_bias
        fields.pop(name)
    a = c.attention
    return fields | {k: getattr(a, k) for k in LATENT} | dict(
        num_key_value_heads=a.num_heads, attention_bias=a.out_bias, first_k_dense_replace=c.num_layers)


def export_v3(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> DeepseekV3Config fields."""
    expect_no_mlp_bias(c, problems, "DeepSeek-V3")
    return latent_export(c, problems, "DeepSeek-V3") | dict(rope_interleave=c.position.interleaved)


def export_v2(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> DeepseekV2Config fields (a model with an MLP bias, which V3 lacks)."""
    if not c.position.interleaved:
        problems.append("position.interleaved=False (DeepSeek-V2 rotates interleaved pairs; without an MLP bias "
                        "the model is written as DeepSeek-V3, whose rope_interleave=False rotates halves)")
    if c.d_model % c.attention.num_heads:
        problems.append(f"d_model={c.d_model} with {c.attention.num_heads} heads (DeepseekV2Config needs "
                        "hidden_size divisible by num_attention_heads)")
    return latent_export(c, problems, "DeepSeek-V2") | dict(mlp_bias=c.feed_forward.bias)


MLA = (("positional", "rope"), ("norm", "rmsnorm"), ("attention.kind", "mla"))  # LLaMA's pairs and one more
V3 = Family(
    model_type="deepseek_v3", name="DeepSeek-V3", model=GPT, base="model", config=config_v3, rules=rules,
    ignored=llama.IGNORED, hf_classes=("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export_v3, export_when=MLA,
)
V2 = Family(
    model_type="deepseek_v2", name="DeepSeek-V2", model=GPT, base="model", config=config_v2, rules=rules,
    ignored=llama.IGNORED, hf_classes=("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export_v2, export_when=(*MLA, ("feed_forward.bias", True)),
)
