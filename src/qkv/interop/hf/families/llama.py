"""LLaMA (Touvron et al. 2023): RoPE half-split (rope_theta) · RMSNorm · SwiGLU · grouped K/V heads.

Also as the config allows: a head width apart from hidden_size / heads (``head_dim``), a bias on
the attention projections (``attention_bias``) and on the MLP's (``mlp_bias``), each on its own, and RoPE
scaling (``rope_scaling`` in 4.x, ``rope_parameters`` in 5.x: linear, dynamic, yarn, llama3 — Llama 3.1/3.2 —
and longrope) as ``position.scaling``.
"""
from __future__ import annotations

import re

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import Rule, embedding_and_head, rope_rows, same, tied_head
from ..settings import (expect, expect_plain_blocks, expect_sequential_blocks, export_activation,
                        export_rope_scaling, read_activation, rope_base_and_scaling, scaled_max_len,
                        uniform_biases)

ATTENTION = (("q_proj", "q_proj", "q_bias"), ("k_proj", "k_proj", "k_bias"), ("v_proj", "v_proj", "v_bias"),
             ("o_proj", "out_proj", "out_bias"))  # HF's name, qkv's, the AttentionConfig field of its bias
MLP = ("gate_proj", "up_proj", "down_proj")
IGNORED = re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb(_local)?\.\w*inv_freq"
                     r"|(model\.)?embed_tokens\.embed_scale")  # tables HF computes (Gemma 3: one per layer type)


def head_dim(hf: dict) -> int | None:
    """``head_dim`` (transformers ≥ 4.45 writes it), None where it is hidden_size / heads."""
    heads, width, dim = hf.get("num_attention_heads", 32), hf.get("hidden_size", 4096), hf.get("head_dim")
    sizes = all(isinstance(n, int) and n > 0 for n in (heads, width))
    return None if dim is None or (sizes and dim * heads == width) else dim


def config(hf: dict, problems: list[str]) -> dict:
    """LlamaConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    return decoder_config(hf, problems, *rope_base_and_scaling(hf, problems))


def decoder_config(hf: dict, problems: list[str], base: float, scaling: dict | None, *,
                   activation: str = "hidden_act") -> dict:
    """The ModelConfig arguments LLaMA and the families built on it (Qwen, Mistral, Gemma) share; each
    family changes what differs."""
    heads = hf.get("num_attention_heads", 32)
    kv_heads = hf.get("num_key_value_heads") or heads  # absent before 4.31: no grouping
    return dict(
        vocab_size=hf.get("vocab_size", 32000), d_model=hf.get("hidden_size", 4096),
        num_layers=hf.get("num_hidden_layers", 32), max_len=scaled_max_len(hf, scaling),
        attention=dict(num_heads=heads, num_kv_heads=None if kv_heads == heads else kv_heads, head_dim=head_dim(hf),
                       **uniform_biases(hf.get("attention_bias", False))),
        position=dict(kind="rope", base=base, scaling=scaling),
        feed_forward=dict(d_ff=hf.get("intermediate_size", 11008), bias=hf.get("mlp_bias", False),
                          activation=read_activation(hf, activation, "silu", problems, gated=True)),
        normalization=dict(kind="rmsnorm", eps=hf.get("rms_norm_eps", 1e-6), first=True, final=True),
        head=dict(tie=hf.get("tie_word_embeddings", False)),
    )


NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ff_norm"))  # HF's name, qkv's
SANDWICH_NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "attn_post_norm"),
                  ("pre_feedforward_layernorm", "ff_norm"), ("post_feedforward_layernorm", "ff_post_norm"))  # Gemma
POST_SUBLAYER_NORMS = (("post_attention_layernorm", "attn_norm"), ("post_feedforward_layernorm", "ff_norm"))  # OLMo 2


def rules(c: ModelConfig) -> list[Rule]:
    """The weight table of LLaMA and the families built on it: Gemma's four norms per block where
    normalization.sandwich, OLMo 2's two after the sublayers where normalization.post_sublayer, the q/k norms
    where attention.qk_norm, each bias where its field is set."""
    out = embedding_and_head(c, "embed_tokens.weight") + [same("norm.weight", "final_norm.weight")]
    rope_heads = {"attn.q_proj": c.attention.num_heads, "attn.k_proj": c.kv_heads} if c.position.interleaved else {}
    projections = [(f"self_attn.{hf}", f"attn.{q}", getattr(c.attention, bias)) for hf, q, bias in ATTENTION]
    projections += [(f"mlp.{name}", f"ff.{name}", c.feed_forward.bias) for name in MLP]
    n = c.normalization
    norms = SANDWICH_NORMS if n.sandwich else POST_SUBLAYER_NORMS if n.post_sublayer else NORMS
    norms += (("self_attn.q_norm", "attn.q_norm"), ("self_attn.k_norm", "attn.k_norm")) if c.attention.qk_norm else ()
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        out += [same(f"{l}{hf}.weight", f"{b}{q}.weight") for hf, q in norms]
        for hf, q, bias in projections:
            heads = rope_heads.get(q)  # interleaved RoPE: q/k rows stored half-split
            for p in ("weight", "bias") if bias else ("weight",):
                key, name = f"{l}{hf}.{p}", f"{b}{q}.{p}"
                out.append(rope_rows(key, name, heads) if heads else same(key, name))
    return out


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> LlamaConfig fields, appending whatever LLaMA has no counterpart for."""
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (LLaMA's attention_bias sets all four)")
    return decoder_export(c, problems, "LLaMA") | dict(attention_bias=a.q_bias)


def decoder_export(c: ModelConfig, problems: list[str], family: str, *, norm: str = "rmsnorm",
                   allowed: tuple[str, ...] = (), activation: str = "hidden_act", prefer: tuple[str, ...] = ()) -> dict:
    """The HF config fields LLaMA and the families built on it share (attention biases apart); ``allowed``: the
    variants the family has (``expect_plain_blocks``)."""
    post = "normalization.post_sublayer" in allowed and c.normalization.post_sublayer  # OLMo-2: norms after, not first
    expect(c, problems, {"normalization.first": not post, "embedding.type_vocab_size": 0, "embedding.norm": False,
                         "normalization.kind": norm, "head.bias": False})
    if "embedding.scale_in_dtype" not in allowed:
        expect(c, problems, {"embedding.scale": False})
    problems += [] if c.has_final_norm else ["normalization.final=False (needs a final norm)"]
    act = export_activation(c, problems, gated=True, prefer=prefer)
    expect_plain_blocks(c, problems, allowed)
    expect_sequential_blocks(c, problems, family)
    if c.position.rotary_dim not in (None, c.head_dim) and "position.rotary_dim" not in allowed:
        problems.append(f"position.rotary_dim={c.position.rotary_dim} of head_dim={c.head_dim} ({family} rotates "
                        "every dimension)")
    a, scaling = c.attention, export_rope_scaling(c, problems)
    fields = dict(vocab_size=c.vocab_size, tie_word_embeddings=c.head.tie, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, hidden_size=c.d_model, intermediate_size=c.ff_width,
                  num_hidden_layers=c.num_layers, num_attention_heads=a.num_heads, num_key_value_heads=c.kv_heads,
                  head_dim=c.head_dim, max_position_embeddings=c.max_len, rms_norm_eps=c.normalization.eps,
                  rope_theta=c.position.base,  # both versions take it (5.x moves it into rope_parameters)
                  mlp_bias=c.feed_forward.bias, attention_dropout=c.dropout)
    return fields | {activation: act} | scaling  # rope_scaling: 4.x's spelling, which 5.x reads into rope_parameters


FAMILY = Family(
    model_type="llama", name="LLaMA", model=GPT, base="model", config=config, rules=rules,
    ignored=IGNORED,
    hf_classes=("LlamaConfig", "LlamaForCausalLM"), copies=tied_head("embed_tokens.weight"),
    export=export, export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm")),
)
