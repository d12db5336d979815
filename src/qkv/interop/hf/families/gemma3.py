"""Gemma 3's text model (Gemma Team 2025, "Gemma 3 Technical Report", §2): Gemma 2's blocks (``gemma2``) with
QK-norm ((1 + w) RMSNorm over each head's q and k before RoPE) in place of the attention soft cap, five sliding
layers to one global (``layer_types``; 4.x: ``sliding_window_pattern`` = 6, layer i global where (i + 1) % 6 = 0),
and two RoPEs: θ = rope_local_base_freq (10 000) on sliding layers, plain, as ``position.local_base``; θ =
rope_theta (1 000 000) and the RoPE scaling (linear × 8 in the 4B+ checkpoints) on global ones.

transformers 5 nests ``rope_parameters`` by layer type ({"full_attention": {…}, "sliding_attention": {…}}); 4.x
writes rope_theta, rope_local_base_freq and rope_scaling (the global layers') at the top level. Both are read.
The multimodal ``gemma3`` config (Gemma3ForConditionalGeneration) is refused by name.
"""
from __future__ import annotations

import dataclasses

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import tied_head
from ..settings import export_layer_types, rope_base_and_scaling, scaled_max_len
from . import gemma2, llama

GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta
ALLOWED = gemma2.ALLOWED + ("attention.qk_norm", "position.local_base")
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq", "partial_rotary_factor")


def layer_rope(hf: dict, nested: dict, layer_type: str) -> dict:
    """One layer type's RoPE settings as a flat config (what ``rope_base_and_scaling`` reads): 5.x's
    ``rope_parameters[layer_type]``, 4.x's top-level theta (and, for global layers, rope_scaling)."""
    flat = {k: v for k, v in hf.items() if k not in ROPE_KEYS}
    if layer_type == "full_attention":  # partial_rotary_factor read (and reported) once, here
        flat |= {k: hf[k] for k in ("rope_scaling", "partial_rotary_factor") if k in hf}
    theta = hf.get("rope_theta", GLOBAL_THETA) if layer_type == "full_attention" else \
        hf.get("rope_local_base_freq", LOCAL_THETA)
    return flat | dict(rope_theta=theta, rope_parameters=nested.get(layer_type))


def ropes(hf: dict, problems: list[str]) -> tuple[float, dict | None, float]:
    """(global θ, global scaling as ``position.scaling``, local θ); scaling on sliding layers is a problem."""
    nested = hf.get("rope_parameters") or {}
    if not isinstance(nested, dict) or set(nested) - {"full_attention", "sliding_attention"}:
        problems.append(f"rope_parameters={nested!r:.80} (expected one object per layer type: full_attention, "
                        "sliding_attention)")
        nested = {}
    base, scaling = rope_base_and_scaling(layer_rope(hf, nested, "full_attention"), problems)
    local, local_scaling = rope_base_and_scaling(layer_rope(hf, nested, "sliding_attention"), problems)
    if local_scaling is not None:
        problems.append(f"RoPE scaling {local_scaling['type']!r} on sliding_attention layers is not supported (qkv's "
                        "local layers rotate with plain RoPE, as Gemma 3's do)")
    return base, scaling, local


def config(hf: dict, problems: list[str]) -> dict:
    """Gemma3TextConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    if hf.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=True is not supported (qkv's Gemma 3 is causal)")
    if hf.get("attn_logit_softcapping") is not None:  # Gemma3Attention never applies it: neither reading is safe
        problems.append(f"attn_logit_softcapping={hf['attn_logit_softcapping']!r} is not supported (Gemma 3 has "
                        "none; transformers' Gemma3Attention ignores it)")
    base, scaling, local = ropes(hf, problems)
    n, pattern = hf.get("num_hidden_layers", 26), hf.get("sliding_window_pattern", 6)
    if hf.get("layer_types") is None and not (isinstance(pattern, int) and pattern > 0):
        problems.append(f"sliding_window_pattern={pattern!r} (expected a positive int)")
        pattern = 6
    types = hf.get("layer_types")
    if types is None:  # 4.x: layer i global where (i + 1) % pattern == 0
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    plain = dict(rope_parameters=dict(rope_theta=base, rope_type="default"), layer_types=types,
                 use_bidirectional_attention=None, attn_logit_softcapping=None)
    out = gemma2.config({k: v for k, v in hf.items() if k not in ROPE_KEYS} | plain, problems)
    sliding = out["layer_types"] is not None
    return out | dict(attention=out["attention"] | dict(qk_norm=True),
                      position=out["position"] | dict(scaling=scaling, local_base=local if sliding else None),
                      max_len=scaled_max_len(hf, scaling))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Gemma3TextConfig fields (4.x's flat RoPE spelling, which 5.x nests by layer type)."""
    gemma2.expect_gemma_blocks(c, problems, "Gemma3")
    fields = llama.decoder_export(c, problems, "Gemma3", norm="rmsnorm_plus_one", allowed=ALLOWED,
                                  activation="hidden_activation", prefer=("gelu_pytorch_tanh",))
    a, p, types = c.attention, c.position, export_layer_types(c)
    if a.softcap is not None:
        problems.append(f"attention.softcap={a.softcap!r} (Gemma 3 has no attention soft cap)")
    if p.local_base is None and p.scaling is not None and "sliding_attention" in types:
        problems.append("position.scaling on sliding layers (position.local_base=None: they share the global "
                        "RoPE; Gemma 3 scales global layers only)")
    return fields | dict(
        attention_bias=a.q_bias, query_pre_attn_scalar=a.query_scalar or c.head_dim, attn_logit_softcapping=None,
        final_logit_softcapping=c.head.softcap, sliding_window=a.sliding_window, layer_types=types,
        rope_local_base_freq=p.local_base or p.base)


def multimodal_config(hf: dict, problems: list[str]) -> dict:
    """Gemma3Config (text + SigLIP vision): refused, with whatever its text config has that qkv lacks too."""
    vision = hf.get("vision_config")
    vision = vision.get("model_type", "a vision tower") if isinstance(vision, dict) else vision
    problems.append(f"Gemma 3's multimodal config (model_type 'gemma3' with vision_config {vision!r}, "
                    "Gemma3ForConditionalGeneration) is not supported: qkv models text only; load the text model "
                    "(gemma3_text, Gemma3ForCausalLM)")
    text = hf.get("text_config")
    return config(text if isinstance(text, dict) else {}, problems)


FAMILY = Family(
    model_type="gemma3_text", name="Gemma3", model=GPT, base="model", config=config,
    rules=llama.rules, ignored=llama.IGNORED, hf_classes=("Gemma3TextConfig", "Gemma3ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm_plus_one"), ("attention.qk_norm", True)),
)
MULTIMODAL = dataclasses.replace(FAMILY, model_type="gemma3", name="Gemma3 (multimodal)", config=multimodal_config,
                                 hf_classes=("Gemma3Config", "Gemma3ForConditionalGeneration"), export=None)
