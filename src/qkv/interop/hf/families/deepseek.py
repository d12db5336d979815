"""DeepSeek-V2 (arXiv 2405.04434) and DeepSeek-V3 (arXiv 2412.19437): LLaMA's blocks (RMSNorm,
SwiGLU, RoPE, an untied head) with multi-head latent attention (``qkv.nn.MultiHeadLatentAttention``, the same
weight names: q_proj or q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).

What differs between the two, as transformers 5 models them:

    V2   RoPE on interleaved pairs always (complex rotation); an MLP bias setting (mlp_bias: the dense MLPs' and
         the shared experts', moe.shared_bias); MoE from layer first_k_dense_replace (default 0: every layer),
         n_routed_experts 64
    V3   rope_interleave (default True) chooses interleaved pairs or halves; no MLP bias; first_k_dense_replace
         default 3, n_routed_experts 256

Interleaved RoPE: Hugging Face rotates pairs (2i, 2i+1) and writes the rotated dims half-split, one permutation
of q_R and k_R alike that no score sees; qkv's interleaved RoPE leaves them in place, so no row is permuted.
YaRN (rope_scaling / rope_parameters, with DeepSeek's mscale and mscale_all_dim) is ``position.scaling``; its
softmax-scale correction is ``qkv.nn.latent_attention.latent_softmax_scale``.
A layer from first_k_dense_replace on is a mixture of experts unless n_routed_experts is None (transformers
builds one there whatever moe_layer_freq says), with ``qkv.nn.moe``'s router and n_shared_experts shared experts
as one SwiGLU of n_shared_experts · moe_intermediate_size. Routing:

    V2   softmax scores; topk_method "greedy" (top-k) or "group_limited_greedy" (a group scores its best expert,
         the best topk_group groups kept: group_score "max"); never renormalised (transformers 5's
         DeepseekV2TopkRouter ignores norm_topk_prob); × routed_scaling_factor        (``v2_experts``)
    V3   sigmoid scores; group-limited top-k (a group scores its two best) chosen with e_score_correction_bias;
         the unbiased weights renormalised (norm_topk_prob) × routed_scaling_factor   (``v3_experts``)

``to_hf`` writes V3 (V2 for a model with an MLP bias or softmax-routed experts).
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ....nn.moe import routing_problems
from ..experts import export_moe, fuse_experts, moe_rules, silu_experts
from ..family import Family
from ..rules import Rule, embedding_and_head, same, tied_head
from ..settings import expect_no_mlp_bias, rope_base_and_scaling, rope_parameters, uniform_biases
from . import llama

# HF's defaults, which V2 and V3 share: the attention section's widths
LATENT = dict(kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
DENSE = "qkv loads DeepSeek-V2 checkpoints whose every layer is dense"
TOPK_METHODS = ("greedy", "group_limited_greedy")  # DeepSeek-V2's, as transformers 5 implements them


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


def latent_config(hf: dict, problems: list[str], *, interleaved: bool, experts: int, first_dense: int,
                  moe: bool = False) -> dict:
    """A DeepSeek config (4.x or 5.x spelling) -> ModelConfig arguments; what differs between V2 and V3 is
    passed: the RoPE pair layout, the MoE defaults, and whether its MoE layers load (``moe``: V3's)."""
    heads = hf.get("num_attention_heads", 32)
    if hf.get("num_key_value_heads") not in (None, heads):
        problems.append(f"num_key_value_heads={hf['num_key_value_heads']!r} with {heads} heads (multi-head latent "
                        "attention has a key and value per head: num_key_value_heads = num_attention_heads)")
    refused = moe_problem(hf, experts, first_dense)
    problems += [refused] if refused and not (moe and refused.endswith(DENSE)) else []
    rope = rope_parameters(hf, [])  # its problems are rope_base_and_scaling's, listed once
    if rope["rope_type"] not in ("default", "yarn") and rope.get("mscale_all_dim"):
        problems.append(f"mscale_all_dim={rope['mscale_all_dim']!r} with RoPE scaling {rope['rope_type']!r} is not "
                        "supported (qkv scales DeepSeek's scores by mscale² with yarn only)")
    out = llama.decoder_config(hf, problems, *rope_base_and_scaling(hf, problems))
    attention = dict(kind="mla", num_heads=heads, **{k: hf.get(k, v) for k, v in LATENT.items()},
                     **uniform_biases(hf.get("attention_bias", False)))
    return out | dict(attention=attention, position=out["position"] | dict(interleaved=interleaved))


def config_v3(hf: dict, problems: list[str]) -> dict:
    """DeepseekV3Config -> ModelConfig arguments: rope_interleave chooses the pairs; the MLP has no bias; the
    layers from first_k_dense_replace on are mixtures of experts (``v3_experts``)."""
    out = latent_config({**hf, "mlp_bias": False}, problems, interleaved=bool(hf.get("rope_interleave", True)),
                        experts=256, first_dense=3, moe=True)
    return out | v3_experts(hf, problems)


def v3_experts(hf: dict, problems: list[str]) -> dict:
    """The ``moe`` section of a DeepseekV3Config whose layers from first_k_dense_replace on have experts; {}
    when none has."""
    n, experts = hf.get("num_hidden_layers", 61), hf.get("n_routed_experts", 256)
    first = hf.get("first_k_dense_replace", 3)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0 or moe_problem(hf, 256, 3) is None:
        return {}  # a bad first_k_dense_replace (latent_config lists it), or every layer dense
    silu_experts(hf, problems)
    width, shared = hf.get("moe_intermediate_size", 2048), hf.get("n_shared_experts", 1)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 1:
        problems.append(f"n_shared_experts={shared!r} (DeepSeek-V3 has at least one shared expert)")
        return {}
    return dict(moe=dict(
        num_experts=experts, top_k=hf.get("num_experts_per_tok", 8), d_expert=width, score="sigmoid",
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)), n_group=hf.get("n_group", 8),
        topk_group=hf.get("topk_group", 4), correction_bias=True,
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 2.5)), d_shared=width * shared,
        layers=None if first == 0 else ["dense"] * first + ["moe"] * (n - first)))


def config_v2(hf: dict, problems: list[str]) -> dict:
    """DeepseekV2Config -> ModelConfig arguments: interleaved pairs always; mlp_bias as given; the layers from
    first_k_dense_replace on mixtures of experts (``v2_experts``)."""
    out = latent_config(hf, problems, interleaved=True, experts=64, first_dense=0, moe=True)
    return out | v2_experts(hf, problems)


def v2_experts(hf: dict, problems: list[str]) -> dict:
    """The ``moe`` section of a DeepseekV2Config whose layers from first_k_dense_replace on have experts
    (softmax, greedy or group-limited by each group's best, unnormalised, scaled); {} when none has."""
    n, first = hf.get("num_hidden_layers", 32), hf.get("first_k_dense_replace", 0)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0 or moe_problem(hf, 64, 0) is None:
        return {}  # a bad first_k_dense_replace (latent_config lists it), or every layer dense
    found = v2_problems(hf)
    silu_experts(hf, found)
    problems += found
    groups = hf.get("topk_method", "greedy") == "group_limited_greedy"
    if found:
        return {}
    width, shared = hf.get("moe_intermediate_size", 1407), hf.get("n_shared_experts", 2)
    return dict(moe=dict(
        num_experts=hf.get("n_routed_experts", 64), top_k=hf.get("num_experts_per_tok"), d_expert=width,
        norm_topk_prob=False, n_group=hf.get("n_group") if groups else None,
        topk_group=hf.get("topk_group") if groups else None, group_score="max",
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)), d_shared=width * shared,
        shared_bias=bool(hf.get("mlp_bias", False)),  # the shared experts are an MLP: mlp_bias's (the routed: none)
        layers=None if first == 0 else ["dense"] * first + ["moe"] * (n - first)))


def v2_problems(hf: dict) -> list[str]:
    """Every problem with a DeepseekV2Config's experts: the routing (topk_method, top-k, groups), the shared
    experts."""
    method, shared = hf.get("topk_method", "greedy"), hf.get("n_shared_experts", 2)
    top_k = hf.get("num_experts_per_tok")
    out = [] if method in TOPK_METHODS else [f"topk_method={method!r} (DeepSeek-V2 routes with one of {TOPK_METHODS})"]
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 1:
        out.append(f"n_shared_experts={shared!r} (DeepSeek-V2 has at least one shared expert)")
    if top_k is None:  # transformers' default, which its router cannot run
        out.append("num_experts_per_tok=None (DeepSeek-V2's mixture-of-experts layers need a top-k; None is "
                   "DeepseekV2Config's default)")
    groups = method == "group_limited_greedy"
    n_group, topk_group = (hf.get("n_group"), hf.get("topk_group")) if groups else (None, None)
    if groups and (n_group is None or topk_group is None):
        return out + [f"topk_method='group_limited_greedy' needs n_group and topk_group, got {n_group!r}, "
                      f"{topk_group!r}"]
    return out + routing_problems(hf.get("n_routed_experts", 64), 1 if top_k is None else top_k,  # None: named above
                                  n_group=n_group, topk_group=topk_group, group_score="max")


def attention_weights(c: ModelConfig) -> list[tuple[str, bool]]:
    """MLA's modules (Hugging Face's names, qkv's alike) and whether each has a bias (attention_bias: q_a, kv_a, o)."""
    b = c.attention.out_bias
    query = [("q_proj", False)] if c.attention.q_lora_rank is None else \
        [("q_a_proj", b), ("q_a_layernorm", False), ("q_b_proj", False)]
    return query + [("kv_a_proj_with_mqa", b), ("kv_a_layernorm", False), ("kv_b_proj", False), ("o_proj", b)]


def rules(c: ModelConfig) -> list[Rule]:
    """The weight table: LLaMA's embedding, norms and MLP, MLA's projections; every tensor as it is; a MoE
    layer's router (its correction bias too), fused experts and shared experts (``experts.moe_rules``)."""
    out = embedding_and_head(c, "embed_tokens.weight") + [same("norm.weight", "final_norm.weight")]
    modules = [(f"self_attn.{name}", f"attn.{name}", bias) for name, bias in attention_weights(c)]
    modules += [(f"mlp.{name}", f"ff.{name}", c.feed_forward.bias) for name in llama.MLP]
    modules += [(hf, q, False) for hf, q in llama.NORMS]
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        out += [same(f"{l}{hf}.{p}", f"{b}{q}.{p}") for hf, q, bias in modules
                for p in (("weight", "bias") if bias else ("weight",))]
    return moe_rules(c, out, shared="shared_experts")


def latent_export(c: ModelConfig, problems: list[str], family: str, *, moe: bool = False) -> dict:
    """The HF config fields V2 and V3 share: LLaMA's (no head_dim, no mlp_bias), MLA's widths, every layer dense
    (``moe``: V3, whose experts ``export_v3_experts`` writes)."""
    allowed = ("attention.kind", "moe") if moe else ("attention.kind",)
    fields = llama.decoder_export(c, problems, family, allowed=allowed)
    for name in ("head_dim", "mlp_bias"):  # HF sets head_dim = qk_rope_head_dim; V3 has no mlp_bias
        fields.pop(name)
    a = c.attention
    return fields | {k: getattr(a, k) for k in LATENT} | dict(
        num_key_value_heads=a.num_heads, attention_bias=a.out_bias, first_k_dense_replace=c.num_layers)


def export_v3(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> DeepseekV3Config fields."""
    expect_no_mlp_bias(c, problems, "DeepSeek-V3")
    fields = latent_export(c, problems, "DeepSeek-V3", moe=True) | dict(rope_interleave=c.position.interleaved)
    return fields | (export_v3_experts(c, problems) if c.moe.enabled else {})


def export_v3_experts(c: ModelConfig, problems: list[str]) -> dict:
    """DeepseekV3Config's MoE fields: dense layers first (first_k_dense_replace), then experts in every layer."""
    m = c.moe
    routing = export_moe(c, problems, "DeepSeek-V3", score="sigmoid", correction_bias=True,
                         routed_scaling_factor=m.routed_scaling_factor, n_group=m.n_group, topk_group=m.topk_group,
                         shared_gate=False)
    first = next((i for i in range(c.num_layers) if c.moe_layer(i)), c.num_layers)
    if any(not c.moe_layer(i) for i in range(first, c.num_layers)):
        problems.append("dense layers after a mixture-of-experts one (DeepSeek-V3's dense layers come first)")
    width = m.d_expert or c.ff_width
    if m.d_shared is None or m.d_shared % width or m.n_group is None:
        problems.append(f"moe.d_shared={m.d_shared}, moe.n_group={m.n_group} (DeepSeek-V3 has n_shared_experts "
                        f"shared experts of moe_intermediate_size={width}, and expert groups)")
    return dict(first_k_dense_replace=first, n_routed_experts=m.num_experts, moe_intermediate_size=width,
                n_shared_experts=(m.d_shared or width) // width, n_group=m.n_group or 1, topk_group=m.topk_group or 1,
                routed_scaling_factor=m.routed_scaling_factor, num_experts_per_tok=routing.get("num_experts_per_tok"),
                norm_topk_prob=m.norm_topk_prob)


def export_v2(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> DeepseekV2Config fields (a model with an MLP bias, which V3 lacks, or V2's experts)."""
    if not c.position.interleaved:
        problems.append("position.interleaved=False (DeepSeek-V2 rotates interleaved pairs; without an MLP bias "
                        "the model is written as DeepSeek-V3, whose rope_interleave=False rotates halves)")
    if c.d_model % c.attention.num_heads:
        problems.append(f"d_model={c.d_model} with {c.attention.num_heads} heads (DeepseekV2Config needs "
                        "hidden_size divisible by num_attention_heads)")
    if not c.feed_forward.bias and not c.moe.enabled:
        problems.append("feed_forward.bias=False and no mixture of experts (such a model is written as DeepSeek-V3)")
    fields = latent_export(c, problems, "DeepSeek-V2", moe=c.moe.enabled) | dict(mlp_bias=c.feed_forward.bias)
    return fields | (export_v2_experts(c, problems) if c.moe.enabled else {})


def export_v2_experts(c: ModelConfig, problems: list[str]) -> dict:
    """DeepseekV2Config's MoE fields: dense layers first, then softmax-routed experts and shared experts."""
    m = c.moe
    routing = export_moe(c, problems, "DeepSeek-V2", n_group=m.n_group, topk_group=m.topk_group,
                         group_score="max" if m.n_group else m.group_score, norm_topk_prob=False,
                         routed_scaling_factor=m.routed_scaling_factor, shared_gate=False,
                         shared_bias=c.feed_forward.bias)  # mlp_bias: the dense MLPs' and the shared experts' alike
    first = next((i for i in range(c.num_layers) if c.moe_layer(i)), c.num_layers)
    if any(not c.moe_layer(i) for i in range(first, c.num_layers)):
        problems.append("dense layers after a mixture-of-experts one (DeepSeek-V2's dense layers come first)")
    width = m.d_expert or c.ff_width
    if m.d_shared is None or m.d_shared % width:
        problems.append(f"moe.d_shared={m.d_shared} (DeepSeek-V2 has n_shared_experts shared experts of "
                        f"moe_intermediate_size={width})")
    return dict(first_k_dense_replace=first, n_routed_experts=m.num_experts, moe_intermediate_size=width,
                n_shared_experts=(m.d_shared or width) // width, n_group=m.n_group, topk_group=m.topk_group,
                topk_method="group_limited_greedy" if m.n_group else "greedy", norm_topk_prob=False,
                routed_scaling_factor=m.routed_scaling_factor, num_experts_per_tok=routing.get("num_experts_per_tok"))


MLA = (("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
       ("attention.kind", "mla"))  # LLaMA's pairs and one more
V3 = Family(
    model_type="deepseek_v3", name="DeepSeek-V3", model=GPT, base="model", config=config_v3, rules=rules,
    ignored=llama.IGNORED, hf_classes=("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), merge=fuse_experts, export=export_v3, export_when=MLA,
)
V2 = Family(
    model_type="deepseek_v2", name="DeepSeek-V2", model=GPT, base="model", config=config_v2, rules=rules,
    ignored=llama.IGNORED, hf_classes=("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), merge=fuse_experts, export=export_v2,
    export_when=(*MLA, ("moe.score", "softmax")),  # dense or V2's experts; export_v2 sends a plain dense one to V3
)
