"""Qwen3-MoE (Qwen team 2025): Qwen3 (QK-norm, an attention bias setting for all four projections) whose
feed-forward is, in the layers Qwen's rule names (``decoder_sparse_step``, ``mlp_only_layers``), a mixture of
``num_experts`` SwiGLU experts of width ``moe_intermediate_size`` (no shared expert), the others a dense MLP of
``intermediate_size``. Routing: softmax over all experts, top-k, renormalised only where ``norm_topk_prob``.
A sliding window in every layer where ``use_sliding_window`` (transformers 5 reads ``sliding_window`` so).
5.x writes ``num_experts`` as ``num_local_experts``; both are read.
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..experts import export_moe, fuse_experts, moe_layers, moe_rules, router_loss_config, silu_experts
from ..family import Family
from ..rules import Rule, tied_head
from ..settings import expect_no_mlp_bias, read_layer_types
from . import llama


def config(hf: dict, problems: list[str]) -> dict:
    """Qwen3MoeConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    out = llama.config({**hf, "mlp_bias": False}, problems)
    n, window = hf.get("num_hidden_layers", 24), hf.get("sliding_window") if hf.get("use_sliding_window") else None
    window, _ = read_layer_types({**hf, "layer_types": None, "sliding_window": window}, problems,
                                 ["sliding_attention" if window is not None else "full_attention"] * n)
    out = out | dict(attention=out["attention"] | dict(qk_norm=True, sliding_window=window))
    experts = hf.get("num_experts", hf.get("num_local_experts", 128))
    layers = moe_layers(hf, problems)
    if not experts or (layers is not None and "moe" not in layers):
        return out  # no expert anywhere: a dense Qwen3
    silu_experts(hf, problems)
    return out | dict(moe=dict(
        num_experts=experts, top_k=hf.get("num_experts_per_tok", 8), d_expert=hf.get("moe_intermediate_size", 768),
        norm_topk_prob=hf.get("norm_topk_prob", False), layers=layers) | router_loss_config(hf))


def rules(c: ModelConfig) -> list[Rule]:
    """LLaMA's table with q/k norms, each MoE layer's MLP a router and fused experts."""
    return moe_rules(c, llama.rules(c))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Qwen3MoeConfig fields."""
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (Qwen3-MoE's attention_bias sets all "
                        "four)")
    expect_no_mlp_bias(c, problems, "Qwen3-MoE")
    if c.layer_types and set(c.layer_types) != {"sliding_attention"}:
        problems.append(f"layer_types={sorted(set(c.layer_types))} (Qwen3-MoE slides in every layer or in none)")
    allowed = ("attention.qk_norm", "attention.sliding_window", "layer_types", "moe")
    fields = llama.decoder_export(c, problems, "Qwen3-MoE", allowed=allowed)
    routing = export_moe(c, problems, "Qwen3-MoE", d_shared=None, shared_gate=False)
    window = a.sliding_window
    return fields | routing | dict(attention_bias=a.q_bias, use_sliding_window=window is not None,
                                   sliding_window=window, num_experts=c.moe.num_experts,
                                   moe_intermediate_size=c.moe.d_expert or c.ff_width)


FAMILY = Family(
    model_type="qwen3_moe", name="Qwen3-MoE", model=GPT, base="model", config=config, rules=rules,
    ignored=llama.IGNORED, hf_classes=("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    copies=tied_head("embed_tokens.weight"), merge=fuse_experts, export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
                 ("attention.kind", "mha"), ("attention.qk_norm", True),
                 ("moe.enabled", True), ("moe.d_shared", None)),
)
