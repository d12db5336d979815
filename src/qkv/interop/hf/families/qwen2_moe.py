"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2 whose feed-forward is, in the layers Qwen's rule names
(``decoder_sparse_step``, ``mlp_only_layers``; ``experts.moe_layers``), a mixture of ``num_experts`` SwiGLU
experts of width ``moe_intermediate_size`` plus a shared expert of width ``shared_expert_intermediate_size``
scaled by σ(``shared_expert_gate``(x)); the other layers a dense MLP of ``intermediate_size``. Routing: softmax in
fp32 over all experts, top-k, renormalised only where ``norm_topk_prob``. Biases on q/k/v where ``qkv_bias``
(5.x; always before). Sliding layers as 5.x's ``layer_types`` list them (else its rule: even layers below
``max_window_layers``).
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..experts import export_moe, fuse_experts, moe_layers, moe_rules, router_loss_config, silu_experts
from ..family import Family
from ..rules import Rule, tied_head
from ..settings import expect_no_mlp_bias, read_layer_types
from . import llama, qwen2


def config(hf: dict, problems: list[str]) -> dict:
    """Qwen2MoeConfig (4.x or 5.x spelling) -> ModelConfig arguments; its experts as ``moe`` even where
    decoder_sparse_step and mlp_only_layers leave every layer dense (so that to_hf writes a Qwen2-MoE again)."""
    out = llama.config({**hf, "attention_bias": False, "mlp_bias": False}, problems)
    n, first, slides = hf.get("num_hidden_layers", 24), hf.get("max_window_layers", 28), hf.get("use_sliding_window")
    default = ["sliding_attention" if slides and i % 2 == 0 and i < first else "full_attention" for i in range(n)]
    window, types = read_layer_types(hf, problems, default)
    biases = qwen2.QWEN_BIASES if hf.get("qkv_bias", True) else dict(q_bias=False, k_bias=False, v_bias=False)
    out = out | dict(layer_types=types, attention=out["attention"] | biases | dict(sliding_window=window))
    experts, layers = hf.get("num_experts", 60), moe_layers(hf, problems)
    if not experts:
        return out  # no expert anywhere: a dense Qwen2
    sparse = layers is None or "moe" in layers  # else every layer dense, its experts kept for to_hf to write back
    if sparse:
        silu_experts(hf, problems)
    shared = hf.get("shared_expert_intermediate_size", 5632)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 1:
        problems += [f"shared_expert_intermediate_size={shared!r} is not supported (qkv's Qwen2-MoE has a shared "
                     "expert: a positive width)"] if sparse else []
        return out
    return out | dict(moe=dict(
        num_experts=experts, top_k=hf.get("num_experts_per_tok", 4), d_expert=hf.get("moe_intermediate_size", 1408),
        norm_topk_prob=hf.get("norm_topk_prob", False), d_shared=shared,
        shared_gate=True, layers=layers) | router_loss_config(hf))


def rules(c: ModelConfig) -> list[Rule]:
    """LLaMA's table (q/k/v biases as set), each MoE layer's MLP a router, fused experts and a gated shared expert."""
    return moe_rules(c, llama.rules(c), shared="shared_expert")


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Qwen2MoeConfig fields."""
    a = c.attention
    if a.biases not in ((True, True, True, False), (False, False, False, False)):
        problems.append(f"attention biases (q, k, v, out) = {a.biases} (Qwen2-MoE has (True, True, True, False) "
                        "or none)")
    expect_no_mlp_bias(c, problems, "Qwen2-MoE")
    fields = llama.decoder_export(c, problems, "Qwen2-MoE", allowed=("attention.sliding_window", "layer_types", "moe"))
    routing = export_moe(c, problems, "Qwen2-MoE", shared_gate=True)
    if c.moe.enabled and c.moe.d_shared is None:
        problems.append("moe.d_shared=None (Qwen2-MoE has a shared expert)")
    return fields | qwen2.export_layers(c) | routing | dict(
        qkv_bias=a.q_bias, num_experts=c.moe.num_experts, moe_intermediate_size=c.moe.d_expert or c.ff_width,
        shared_expert_intermediate_size=c.moe.d_shared)


FAMILY = Family(
    model_type="qwen2_moe", name="Qwen2-MoE", model=GPT, base="model", config=config, rules=rules,
    ignored=llama.IGNORED, hf_classes=("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    copies=tied_head("embed_tokens.weight"), merge=fuse_experts, export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
                 ("attention.kind", "mha"), ("attention.qk_norm", False),
                 ("feed_forward.bias", False), ("moe.enabled", True), ("moe.shared_gate", True)),  # more than Qwen2's
)
