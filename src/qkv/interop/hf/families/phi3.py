"""Phi-3 / Phi-3.5 / Phi-4-mini (Abdin et al. 2024): LLaMA with fused projections, RoPE on part of each head,
LongRoPE and a sliding window in every layer.

    qkv_proj                one (H·D + 2·G·D, C) matrix [W_Q; W_K; W_V], split on load and joined on export
    gate_up_proj            one (2F, C) matrix [W_gate; W_up]
    partial_rotary_factor   RoPE rotates the first int(D · factor) dims of each head (Phi-4-mini: 0.75)
    rope_parameters         plain, or longrope (short/long factors, original_max_position_embeddings, the
                            attention factor); older checkpoints say "su" or "yarn", which transformers reads as
                            longrope (and so does qkv)
    sliding_window          when set, every layer attends within it (transformers ≥ 4.48 masks with it whatever the
                            attention implementation); a window of max_position_embeddings or more never binds
No attention or MLP bias. A qkv model that rotates whole heads is LLaMA's (or Mistral's, with a window):
``to_hf`` writes it there; one rotating part of each head is written as Phi-3.
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family, Not
from ..rules import Rule, embedding_and_head, same, stacked_rows, tied_head
from ..settings import expect, read_layer_types, read_rope_scaling, rope_parameters
from . import gpt_neox, llama

DEFAULTS = dict(rms_norm_eps=1e-5, tie_word_embeddings=False, original_max_position_embeddings=4096)
OLD_LONGROPE = ("su", "yarn")  # Phi-3's names for longrope before transformers 4.42 (its configuration_phi3.py)


def rotary_dim(hf: dict, share, problems: list[str]) -> int | None:
    """int(D · partial_rotary_factor), D as Phi-3's attention takes it; None: every dim."""
    heads, width = hf.get("num_attention_heads", 32), hf.get("hidden_size", 3072)
    if not all(isinstance(n, int) and n > 0 for n in (heads, width)):
        return None  # ModelConfig names the bad size
    return gpt_neox.rotary_dims({**hf, "hidden_size": (llama.head_dim(hf) or width // heads) * heads}, share, problems)


def window(hf: dict, problems: list[str]) -> int | None:
    """sliding_window, every layer; None where there is none or it is as long as the context."""
    w, n = hf.get("sliding_window"), hf.get("num_hidden_layers", 32)
    if isinstance(w, int) and not isinstance(w, bool) and w >= hf.get("max_position_embeddings", 4096):
        return None
    return read_layer_types({**hf, "layer_types": None}, problems,
                            ["sliding_attention" if w is not None else "full_attention"] * n)[0]


def config(hf: dict, problems: list[str]) -> dict:
    """Phi3Config (4.x or 5.x spelling) -> ModelConfig arguments."""
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k not in DEFAULTS}}
    rope = rope_parameters(hf, problems)
    if rope["rope_type"] in OLD_LONGROPE:
        rope["rope_type"] = "longrope"
    if rope["rope_type"] not in ("default", "longrope"):
        problems.append(f"RoPE scaling {rope['rope_type']!r} is not supported (Phi-3 has 'default' or 'longrope', "
                        f"as transformers' Phi3Config)")
        rope["rope_type"] = "default"
    out = llama.decoder_config({**hf, "attention_bias": False, "mlp_bias": False}, problems, rope["rope_theta"],
                               read_rope_scaling(rope, hf, problems))
    dims = rotary_dim(hf, rope.get("partial_rotary_factor", 1.0), problems)
    return out | dict(attention=out["attention"] | dict(sliding_window=window(hf, problems)),
                      position=out["position"] | dict(rotary_dim=dims))


def rules(c: ModelConfig) -> list[Rule]:
    """LLaMA's table with q/k/v and gate/up each one fused matrix."""
    out = embedding_and_head(c, "embed_tokens.weight") + [same("norm.weight", "final_norm.weight")]
    q, kv, f = c.attention.num_heads * c.head_dim, c.kv_heads * c.head_dim, c.ff_width
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        out += [same(f"{l}{hf}.weight", f"{b}{name}.weight") for hf, name in llama.NORMS]
        out += [stacked_rows(f"{l}self_attn.qkv_proj.weight", tuple(f"{b}attn.{n}_proj.weight" for n in "qkv"),
                             (q, kv, kv)),
                same(f"{l}self_attn.o_proj.weight", f"{b}attn.out_proj.weight"),
                stacked_rows(f"{l}mlp.gate_up_proj.weight", (f"{b}ff.gate_proj.weight", f"{b}ff.up_proj.weight"),
                             (f, f)),
                same(f"{l}mlp.down_proj.weight", f"{b}ff.down_proj.weight")]
    return out


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> Phi3Config fields."""
    if any(c.attention.biases) or c.feed_forward.bias:
        problems.append(f"attention biases (q, k, v, out) = {c.attention.biases}, feed_forward.bias="
                        f"{c.feed_forward.bias} (Phi-3 has none)")
    if c.layer_types and set(c.layer_types) != {"sliding_attention"}:
        problems.append(f"layer_types={sorted(set(c.layer_types))} (Phi-3 slides in every layer or none)")
    expect(c, problems, {"position.interleaved": False})
    fields = llama.decoder_export(c, problems, "Phi-3", allowed=(
        "attention.sliding_window", "layer_types", "position.rotary_dim"))
    fields.pop("mlp_bias")
    if c.head_dim * c.attention.num_heads == c.d_model:
        fields.pop("head_dim")  # not a Phi3Config field; transformers' Phi-3 reads one where a config has it
    s = c.position.scaling
    longrope = s is not None and s.type == "longrope"  # its L₀ at the top level too, where Phi3Config keeps it
    top = dict(original_max_position_embeddings=s.original_max_position_embeddings) if longrope else {}
    return fields | top | dict(sliding_window=c.attention.sliding_window,
                               partial_rotary_factor=gpt_neox.rotary_share(c, problems))


FAMILY = Family(
    model_type="phi3", name="Phi-3", model=GPT, base="model", config=config, rules=rules,
    ignored=llama.IGNORED, hf_classes=("Phi3Config", "Phi3ForCausalLM"), copies=tied_head("embed_tokens.weight"),
    export=export, export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"),
                                ("position.rotary_dim", Not(None))),
)
