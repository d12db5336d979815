"""Mixtral (Jiang et al. 2024, arXiv 2401.04088): Mistral whose every feed-forward is a sparse mixture of
``num_local_experts`` SwiGLU experts of width ``intermediate_size``, ``num_experts_per_tok`` of them per token:
softmax over all experts in fp32, top-k, the k weights renormalised (``qkv.nn.moe``). A sliding window
(``sliding_window``, may be None) in every layer, as Mistral's; no bias anywhere.

Checkpoints on disk name the block ``block_sparse_moe`` and each expert's w1 (gate), w3 (up), w2 (down); they are
renamed to transformers 5's names (``mlp``, gate_proj, up_proj, down_proj) and fused (``experts.fuse_experts``).
``router_jitter_noise`` is a training setting, not read; ``router_aux_loss_coef`` is read as moe.aux_loss_coef where
``output_router_logits`` is true (``experts.router_loss_config``).
"""
from __future__ import annotations

import re

from ....models import GPT, ModelConfig
from ..experts import export_moe, fuse_experts, moe_rules, router_loss_config, silu_experts
from ..family import Family
from ..rules import Rule, tied_head
from . import llama, mistral

EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
OLD_EXPERT = re.compile(r"(.*\.experts\.\d+)\.(w[123])\.weight")


def rename(key: str) -> str:
    """A Mixtral checkpoint's key (block_sparse_moe, experts.{e}.w1) -> transformers 5's
    (mlp, experts.{e}.gate_proj)."""
    key = key.replace(".block_sparse_moe.", ".mlp.")
    m = OLD_EXPERT.fullmatch(key)
    return f"{m[1]}.{EXPERT_NAMES[m[2]]}.weight" if m else key


def config(hf: dict, problems: list[str]) -> dict:
    """MixtralConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    out = mistral.config(hf, problems)
    width = hf.get("intermediate_size", 14336)
    silu_experts(hf, problems)
    return out | dict(moe=dict(num_experts=hf.get("num_local_experts", 8), top_k=hf.get("num_experts_per_tok", 2),
                               d_expert=width, norm_topk_prob=True) | router_loss_config(hf))


def rules(c: ModelConfig) -> list[Rule]:
    """LLaMA's table, each layer's MLP a router and fused experts."""
    return moe_rules(c, llama.rules(c))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> MixtralConfig fields."""
    if any(c.attention.biases):
        problems.append(f"attention biases (q, k, v, out) = {c.attention.biases} (Mixtral has none)")
    if c.feed_forward.bias:
        problems.append("feed_forward.bias=True (Mixtral's experts have no bias)")
    if c.layer_types and set(c.layer_types) != {"sliding_attention"}:
        problems.append(f"layer_types={sorted(set(c.layer_types))} (Mixtral slides in every layer or in none)")
    fields = llama.decoder_export(c, problems, "Mixtral", allowed=("attention.sliding_window", "layer_types", "moe"))
    routing = export_moe(c, problems, "Mixtral", norm_topk_prob=True, d_shared=None, shared_gate=False, layers=None)
    return fields | dict(sliding_window=c.attention.sliding_window, num_local_experts=c.moe.num_experts,
                         intermediate_size=c.moe.d_expert or c.ff_width,
                         num_experts_per_tok=routing.get("num_experts_per_tok")) | {
        k: routing[k] for k in ("router_aux_loss_coef", "output_router_logits") if k in routing}


FAMILY = Family(
    model_type="mixtral", name="Mixtral", model=GPT, base="model", config=config, rules=rules,
    ignored=llama.IGNORED, hf_classes=("MixtralConfig", "MixtralForCausalLM"),
    copies=tied_head("embed_tokens.weight"), rename=rename, merge=fuse_experts, export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
                 ("attention.kind", "mha"), ("attention.qk_norm", False),
                 ("attention.biases", (False, False, False, False)), ("moe.enabled", True), ("moe.d_shared", None)),
)
