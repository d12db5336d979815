"""BERT (Devlin et al. 2019): learned PE + token types + embedding LayerNorm · post-LN · gelu.

Loaded as a ``qkv.Encoder`` without the pooler or the MLM/NSP heads; there is no ``to_hf`` for it.
"""
from __future__ import annotations

import re

from ....models import Encoder, ModelConfig
from ..family import Family
from ..rules import Rule, same
from ..settings import read_activation, require, uniform_biases

LAYER = (("attention.self.query", "attn.q_proj"), ("attention.self.key", "attn.k_proj"),
         ("attention.self.value", "attn.v_proj"), ("attention.output.dense", "attn.out_proj"),
         ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "ff.up_proj"),
         ("output.dense", "ff.down_proj"), ("output.LayerNorm", "ff_norm"))
LEGACY = re.compile(r"(.*\.LayerNorm)\.(gamma|beta)")


def modern_name(key: str) -> str:
    """TF-era BERT checkpoints call LayerNorm parameters gamma/beta (HF renames them on load too)."""
    m = LEGACY.fullmatch(key)
    return key if m is None else f"{m[1]}.{'weight' if m[2] == 'gamma' else 'bias'}"


def config(hf: dict, problems: list[str]) -> dict:
    """BertConfig -> ModelConfig arguments (position_embedding_type: 4.x only, where it must be absolute)."""
    require(hf, problems, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    return dict(
        vocab_size=hf.get("vocab_size", 30522), d_model=hf.get("hidden_size", 768),
        num_layers=hf.get("num_hidden_layers", 12), max_len=hf.get("max_position_embeddings", 512),
        attention=dict(num_heads=hf.get("num_attention_heads", 12), **uniform_biases(True)),
        position=dict(kind="learned"),
        feed_forward=dict(d_ff=hf.get("intermediate_size", 3072), bias=True,
                          activation=read_activation(hf, "hidden_act", "gelu", problems)),
        normalization=dict(kind="layernorm", eps=hf.get("layer_norm_eps", 1e-12), first=False, final=False),
        embedding=dict(type_vocab_size=hf.get("type_vocab_size", 2), norm=True),
        head=dict(tie=False),
    )


def rules(c: ModelConfig) -> list[Rule]:
    embeddings = [("word_embeddings", "tok"), ("position_embeddings", "pos")]
    embeddings += [("token_type_embeddings", "token_type")] if c.embedding.type_vocab_size else []
    out = [same(f"embeddings.{hf}.weight", f"embed.{q}.weight") for hf, q in embeddings]
    out += [same(f"embeddings.LayerNorm.{p}", f"embed.norm.{p}") for p in ("weight", "bias")]
    for i in range(c.num_layers):
        out += [same(f"encoder.layer.{i}.{hf}.{p}", f"blocks.{i}.{q}.{p}") for hf, q in LAYER for p in ("weight", "bias")]
    return out


FAMILY = Family(
    model_type="bert", name="BERT", model=Encoder, base="bert", config=config, rules=rules,
    ignored=re.compile(r"(bert\.)?(embeddings\.position_ids|pooler\..+)|cls\..+"),  # the pooler and task heads
    hf_classes=("BertConfig", "BertModel"), rename=modern_name,
)
