"""GPT-2 (Radford et al. 2019): learned PE · pre-LN LayerNorm · gelu_tanh ("gelu_new") · biases · tied head.

Its Conv1D stores W transposed, and c_attn packs Q, K, V in one matrix.
"""
from __future__ import annotations

import re

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import Rule, conv1d, embedding_and_head, packed_qkv, same, tied_head
from ..settings import (expect, expect_biases, expect_plain_blocks, expect_sequential_blocks, expect_whole_heads,
                        export_activation, read_activation, require, uniform_biases)


def config(hf: dict, problems: list[str]) -> dict:
    """GPT2Config -> ModelConfig arguments."""
    require(hf, problems, add_cross_attention=False, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False)
    return dict(
        vocab_size=hf.get("vocab_size", 50257), d_model=hf.get("n_embd", 768), num_layers=hf.get("n_layer", 12),
        max_len=hf.get("n_positions", 1024),
        attention=dict(num_heads=hf.get("n_head", 12), **uniform_biases(True)),
        position=dict(kind="learned"),
        feed_forward=dict(d_ff=hf.get("n_inner"), bias=True,
                          activation=read_activation(hf, "activation_function", "gelu_new", problems)),
        normalization=dict(kind="layernorm", eps=hf.get("layer_norm_epsilon", 1e-5), first=True, final=True),
        head=dict(tie=hf.get("tie_word_embeddings", True)),
    )


def rules(c: ModelConfig) -> list[Rule]:
    out = embedding_and_head(c, "wte.weight") + [
        same("wpe.weight", "embed.pos.weight"), same("ln_f.weight", "final_norm.weight"),
        same("ln_f.bias", "final_norm.bias")]
    for i in range(c.num_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        out += [packed_qkv(f"{h}attn.c_attn.{p}", tuple(f"{b}attn.{n}_proj.{p}" for n in "qkv"))
                for p in ("weight", "bias")]
        out += [conv1d(h + hf, b + q) for hf, q in (("attn.c_proj.weight", "attn.out_proj.weight"),
                                                    ("mlp.c_fc.weight", "ff.up_proj.weight"),
                                                    ("mlp.c_proj.weight", "ff.down_proj.weight"))]
        out += [same(h + hf, b + q) for hf, q in (
            ("ln_1.weight", "attn_norm.weight"), ("ln_1.bias", "attn_norm.bias"), ("attn.c_proj.bias", "attn.out_proj.bias"),
            ("ln_2.weight", "ff_norm.weight"), ("ln_2.bias", "ff_norm.bias"),
            ("mlp.c_fc.bias", "ff.up_proj.bias"), ("mlp.c_proj.bias", "ff.down_proj.bias"))]
    return out


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> GPT2Config fields, appending whatever GPT-2 has no counterpart for."""
    expect(c, problems, {"normalization.first": True, "embedding.type_vocab_size": 0, "embedding.norm": False,
                         "embedding.scale": False, "normalization.kind": "layernorm", "head.bias": False})
    problems += [] if c.has_final_norm else ["normalization.final=False (needs a final norm)"]
    expect_plain_blocks(c, problems)
    expect_sequential_blocks(c, problems, "GPT-2")
    expect_biases(c, problems, "GPT-2")
    expect_whole_heads(c, problems, "GPT-2")
    activation = export_activation(c, problems, gated=False)
    return dict(vocab_size=c.vocab_size, tie_word_embeddings=c.head.tie, bos_token_id=None, eos_token_id=None,
                pad_token_id=None, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.num_layers,
                n_head=c.attention.num_heads, n_inner=c.feed_forward.d_ff, activation_function=activation,
                layer_norm_epsilon=c.normalization.eps, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
                attn_pdrop=c.dropout)


FAMILY = Family(
    model_type="gpt2", name="GPT-2", model=GPT, base="transformer", config=config, rules=rules,
    ignored=re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias"),  # old causal-mask buffers
    hf_classes=("GPT2Config", "GPT2LMHeadModel"), copies=tied_head("wte.weight"),
    export=export, export_when=("position.kind", "learned"),
)
