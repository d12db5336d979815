"""gpt-oss (OpenAI 2025, gpt-oss-20b / -120b): LLaMA's blocks (RMSNorm, half-split RoPE, grouped K/V heads, an
untied head) with what differs:

    attention    a learned sink logit per head in each softmax's denominator (``self_attn.sinks``: attention.kind
                 "sink", ``qkv.nn.sink_attention``); biases on q, k, v and o (attention_bias, default True);
                 sliding and full layers alternating (layer_types, sliding_window)
    RoPE         YaRN (rope_parameters: factor 32, beta_fast 32, beta_slow 1, truncate False) as position.scaling
    feed-forward every layer a mixture of num_local_experts experts of width intermediate_size: a router with a
                 bias, top-k of the logits then softmax over those k (moe.top_k_first); experts with biases and
                 the clamped SwiGLU (swiglu_limit L, swiglu_alpha α): W_down ((u + 1) ⊙ g σ(α g)) + b, g ≤ L, |u| ≤ L

Experts as transformers stores them (transposed against Mixtral's, gate and up interleaved):

    mlp.experts.gate_up_proj       (E, C, 2I)   gate = [..., ::2], up = [..., 1::2]   qkv: gate_proj, up_proj (E, I, C)
    mlp.experts.gate_up_proj_bias  (E, 2I)      the same interleaving                 gate_bias, up_bias (E, I)
    mlp.experts.down_proj          (E, I, C)                                          down_proj (E, C, I)
    mlp.experts.down_proj_bias     (E, C)                                             down_bias (E, C)

The released checkpoints hold the experts in MXFP4 (quantization_config): refused; load a dequantised copy.
"""
from __future__ import annotations

import torch

from ....models import GPT, ModelConfig
from ..experts import export_moe
from ..family import Family
from ..rules import Rule, same, tied_head
from ..settings import export_layer_types, read_layer_types, rope_base_and_scaling
from . import llama

DEFAULTS = dict(  # GptOssConfig's, where they differ from LlamaConfig's
    vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
    num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, attention_bias=True, sliding_window=128,
    max_position_embeddings=131072, rope_theta=150000.0, num_local_experts=128, num_experts_per_tok=4,
    swiglu_alpha=1.702, swiglu_limit=7.0,
    rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                         original_max_position_embeddings=4096))


def config(hf: dict, problems: list[str]) -> dict:
    """GptOssConfig -> ModelConfig arguments."""
    defaults = {k: v for k, v in DEFAULTS.items() if k != "rope_parameters" or not hf.get("rope_scaling")}  # 4.x
    hf = defaults | {k: v for k, v in hf.items() if v is not None or k != "rope_parameters"}  # None: HF's YaRN
    if hf.get("quantization_config"):
        method = hf["quantization_config"].get("quant_method") if isinstance(hf["quantization_config"], dict) else None
        problems.append(f"quantization_config quant_method={method!r} (qkv loads gpt-oss with unquantised experts: "
                        "dequantise the checkpoint first)")
    out = llama.decoder_config({**hf, "mlp_bias": False}, problems, *rope_base_and_scaling(hf, problems))
    n = hf["num_hidden_layers"]
    default = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n if isinstance(n, int) else 0)]
    window, types = read_layer_types(hf, problems, default)
    attention = out["attention"] | dict(kind="sink", sliding_window=window)
    return out | dict(attention=attention, layer_types=types, moe=dict(
        num_experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"], d_expert=hf["intermediate_size"],
        top_k_first=True, router_bias=True, expert_bias=True, activation="swiglu_clamped",
        swiglu_limit=float(hf["swiglu_limit"]), swiglu_alpha=float(hf["swiglu_alpha"])))


def interleaved(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., 2I) with gate and up interleaved -> gate (..., I), up (..., I)."""
    return t[..., ::2], t[..., 1::2]


def interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up (..., I) -> (..., 2I): gate_0, up_0, gate_1, up_1, …"""
    return torch.stack([gate, up], dim=-1).flatten(-2)  # (..., I, 2) -> (..., 2I)


def expert_rules(hf: str, q: str) -> list[Rule]:
    """One layer's experts: HF's transposed, interleaved tensors under ``hf`` <-> qkv's SwiGLUExperts under ``q``."""
    def t(x):
        return x.transpose(1, 2)  # (E, a, b) -> (E, b, a)
    return [
        Rule(f"{hf}.gate_up_proj", (f"{q}.gate_proj", f"{q}.up_proj"),
             lambda w: tuple(t(x) for x in interleaved(w)), lambda ws: interleave(t(ws[0]), t(ws[1]))),
        Rule(f"{hf}.gate_up_proj_bias", (f"{q}.gate_bias", f"{q}.up_bias"), interleaved,
             lambda bs: interleave(*bs)),
        Rule(f"{hf}.down_proj", (f"{q}.down_proj",), lambda w: (t(w),), lambda ws: t(ws[0])),
        same(f"{hf}.down_proj_bias", f"{q}.down_bias"),
    ]


def rules(c: ModelConfig) -> list[Rule]:
    """LLaMA's table without its MLP, each layer's sinks, router (weight and bias) and experts."""
    out = [r for r in llama.rules(c) if ".ff." not in r.qkv[0]]
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        out += [same(f"{l}self_attn.sinks", f"{b}attn.sinks"), same(f"{l}mlp.router.weight", f"{b}ff.router.weight"),
                same(f"{l}mlp.router.bias", f"{b}ff.router.bias")]
        out += expert_rules(f"{l}mlp.experts", f"{b}ff.experts")
    return out


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> GptOssConfig fields."""
    a, m = c.attention, c.moe
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (gpt-oss's attention_bias sets all four)")
    if m.enabled and m.layers is not None and set(m.layers) != {"moe"}:
        problems.append("dense layers among the mixture-of-experts ones (gpt-oss has experts in every layer)")
    allowed = ("attention.kind", "attention.sliding_window", "layer_types", "moe")
    fields = llama.decoder_export(c, problems, "gpt-oss", allowed=allowed)
    export_moe(c, problems, "gpt-oss", top_k_first=True, router_bias=True, expert_bias=True,
               activation="swiglu_clamped", d_shared=None, shared_gate=False)
    s = c.position.scaling
    rope = dict(rope_type="default") if s is None else {("rope_type" if k == "type" else k): v
                                                          for k, v in s.to_dict().items()}
    fields.pop("rope_scaling", None)
    return fields | dict(
        attention_bias=a.q_bias, layer_types=export_layer_types(c),
        sliding_window=a.sliding_window or c.max_len,  # GptOssModel needs one, sliding layers or not: no layer slides
        num_local_experts=m.num_experts, num_experts_per_tok=m.top_k, intermediate_size=m.d_expert or c.ff_width,
        swiglu_limit=m.swiglu_limit, swiglu_alpha=m.swiglu_alpha,
        rope_parameters=rope | dict(rope_theta=c.position.base))


FAMILY = Family(
    model_type="gpt_oss", name="gpt-oss", model=GPT, base="model", config=config, rules=rules,
    ignored=llama.IGNORED, hf_classes=("GptOssConfig", "GptOssForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
                 ("attention.kind", "sink"), ("moe.enabled", True)),
)
