"""GPT-NeoX (Black et al. 2022; Pythia, Biderman et al. 2023): RoPE half-split on part of each head · pre-LN
LayerNorm · gelu · biases · a parallel or sequential residual.

    query_key_value  one (3C, C) matrix whose rows go by head: each head's q, k and v rows together
    rotary_pct       RoPE rotates the first int(D · rotary_pct) dims of each head (Pythia: 0.25); the rest
                     pass through (``position.rotary_dim``)
    use_parallel_residual  True (GPT-NeoX's and Pythia's default): x + Attn(LN₁(x)) + MLP(LN₂(x)), a
                     ``feed_forward.parallel`` block; False: the sequential pre-LN block GPT-2 and LLaMA have
    attention_bias   the bias of query_key_value and dense; the MLP always has biases (written as zeros for
                     a qkv model without them)

transformers 4.x spells RoPE's settings rotary_emb_base and rotary_pct (later 4.x also rope_theta and
partial_rotary_factor beside them) and calls the LM head embed_out; 5.x holds them in rope_parameters and
calls it lm_head. Both are read; ``to_hf`` writes what either version's GPTNeoXConfig takes.
"""
from __future__ import annotations

import math
import re

from ....models import GPT, ModelConfig
from ..family import Family
from ..rules import HEAD, Rule, embedding_and_head, packed_qkv_per_head, same, tied_head, zero_bias
from ..settings import (ROPE_THETA, expect, expect_plain_blocks, expect_plain_rope, expect_whole_heads,
                        export_activation, read_activation, rope_base_and_share, uniform_biases)

ROTARY_SHARE = 0.25  # GPTNeoXConfig's rotary_pct (4.x) and partial_rotary_factor (5.x) when a config has none
SPELLINGS = (("rope_theta", "rotary_emb_base", ROPE_THETA), ("partial_rotary_factor", "rotary_pct", ROTARY_SHARE))
LAYERS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ff_norm"))
MLP = (("mlp.dense_h_to_4h", "ff.up_proj"), ("mlp.dense_4h_to_h", "ff.down_proj"))


def today_spelling(hf: dict, problems: list[str]) -> dict:
    """The config with RoPE's 4.x names (rotary_emb_base, rotary_pct) read as rope_theta and
    partial_rotary_factor, which ``rope_parameters`` reads beside 5.x's rope_parameters (which wins, as in 5.x)."""
    out = dict(hf)
    for name, old, default in SPELLINGS:
        if name in hf and old in hf and hf[name] != hf[old]:
            problems.append(f"{old}={hf[old]!r} and {name}={hf[name]!r} disagree (transformers 4.x writes the "
                            "same value under both names)")
        out[name] = hf.get(name, hf.get(old, default))
    return out


def rotary_dims(hf: dict, share, problems: list[str]) -> int | None:
    """The dims of each head RoPE rotates, int(D · share) as transformers computes them; None: all D."""
    heads, width = hf.get("num_attention_heads", 64), hf.get("hidden_size", 6144)
    if not all(isinstance(n, int) and n > 0 for n in (heads, width)):
        return None  # ModelConfig names the bad size
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        problems.append(f"partial_rotary_factor (rotary_pct)={share!r} is not supported (expected a share of "
                        "each head in (0, 1])")
        return None
    head_dim = width // heads
    dims = int(head_dim * share)
    if dims < 2 or dims % 2:
        problems.append(f"partial_rotary_factor (rotary_pct)={share!r} rotates int({head_dim} × {share}) = {dims} "
                        "dims of each head (qkv rotates pairs: expected an even number, at least 2)")
        return None
    return None if dims == head_dim else dims


def config(hf: dict, problems: list[str]) -> dict:
    """GPTNeoXConfig (4.x or 5.x spelling) -> ModelConfig arguments."""
    hf = today_spelling(hf, problems)
    base, share = rope_base_and_share(hf, problems)
    return dict(
        vocab_size=hf.get("vocab_size", 50432), d_model=hf.get("hidden_size", 6144),
        num_layers=hf.get("num_hidden_layers", 44), max_len=hf.get("max_position_embeddings", 2048),
        attention=dict(num_heads=hf.get("num_attention_heads", 64), **uniform_biases(hf.get("attention_bias", True))),
        position=dict(kind="rope", base=base, rotary_dim=rotary_dims(hf, share, problems)),
        feed_forward=dict(d_ff=hf.get("intermediate_size", 24576), bias=True,
                          activation=read_activation(hf, "hidden_act", "gelu", problems),
                          parallel=hf.get("use_parallel_residual", True)),
        normalization=dict(kind="layernorm", eps=hf.get("layer_norm_eps", 1e-5), first=True, final=True),
        head=dict(tie=hf.get("tie_word_embeddings", False)),
    )


def layer_rules(c: ModelConfig, i: int) -> list[Rule]:
    """Block i's weights: attention (q, k, v packed by head), its two LayerNorms, the MLP."""
    l, b = f"layers.{i}.", f"blocks.{i}."
    packed = ("weight", "bias") if c.attention.q_bias else ("weight",)
    out = [packed_qkv_per_head(f"{l}attention.query_key_value.{p}", tuple(f"{b}attn.{n}_proj.{p}" for n in "qkv"),
                               c.attention.num_heads) for p in packed]
    out += [same(f"{l}attention.dense.{p}", f"{b}attn.out_proj.{p}")
            for p in (("weight", "bias") if c.attention.out_bias else ("weight",))]
    out += [same(f"{l}{hf}.{p}", f"{b}{q}.{p}") for hf, q in LAYERS for p in ("weight", "bias")]
    for hf, q in MLP:
        out.append(same(f"{l}{hf}.weight", f"{b}{q}.weight"))
        bias = same(f"{l}{hf}.bias", f"{b}{q}.bias") if c.feed_forward.bias else zero_bias(f"{l}{hf}.bias",
                                                                                             f"{b}{q}.weight")
        out.append(bias)
    return out


def rules(c: ModelConfig) -> list[Rule]:
    out = embedding_and_head(c, "embed_in.weight")
    out += [same(f"final_layer_norm.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
    return out + [r for i in range(c.num_layers) for r in layer_rules(c, i)]


def rotary_share(c: ModelConfig, problems: list[str]) -> float:
    """rotary_pct for ``c``'s rotated dims R, such that transformers' int(D · rotary_pct) gives R back: R / D,
    or the float just above it where D · (R / D) rounds below R (D = 44, R = 30: 29.999…)."""
    dims = c.position.rotary_dim or c.head_dim
    share = dims / c.head_dim
    share = share if int(c.head_dim * share) == dims else math.nextafter(share, 2.0)
    if int(c.head_dim * share) != dims:
        problems.append(f"position.rotary_dim={dims} of head_dim={c.head_dim} (transformers computes "
                        f"int({c.head_dim} × {share!r}) = {int(c.head_dim * share)} rotated dims)")
    return share


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> GPTNeoXConfig fields, appending whatever GPT-NeoX has no counterpart for."""
    expect(c, problems, {"normalization.first": True, "embedding.type_vocab_size": 0, "embedding.norm": False,
                         "embedding.scale": False, "normalization.kind": "layernorm", "position.interleaved": False,
                         "head.bias": False})
    problems += [] if c.has_final_norm else ["normalization.final=False (needs a final norm)"]
    expect_plain_blocks(c, problems)
    expect_whole_heads(c, problems, "GPT-NeoX")
    expect_plain_rope(c, problems, "GPT-NeoX")
    a = c.attention
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (GPT-NeoX's attention_bias sets all "
                        "four)")
    activation = export_activation(c, problems, gated=False)
    return dict(vocab_size=c.vocab_size, tie_word_embeddings=c.head.tie, bos_token_id=None, eos_token_id=None,
                pad_token_id=None, hidden_size=c.d_model, intermediate_size=c.ff_width, num_hidden_layers=c.num_layers,
                num_attention_heads=a.num_heads, hidden_act=activation, max_position_embeddings=c.max_len,
                layer_norm_eps=c.normalization.eps, use_parallel_residual=c.feed_forward.parallel,
                attention_bias=a.q_bias, hidden_dropout=c.dropout, attention_dropout=c.dropout,
                rotary_emb_base=c.position.base, rotary_pct=rotary_share(c, problems))  # both versions take these


def modern_name(key: str) -> str:
    """transformers 4.x's LM head, embed_out (Pythia's checkpoints), is 5.x's lm_head."""
    return HEAD if key == "embed_out.weight" else key


FAMILY = Family(
    model_type="gpt_neox", name="GPT-NeoX", model=GPT, base="gpt_neox", config=config, rules=rules,
    ignored=re.compile(r"(gpt_neox\.)?(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"
                       r"|rotary_emb\.inv_freq)"),  # 4.x's causal-mask and RoPE buffers
    hf_classes=("GPTNeoXConfig", "GPTNeoXForCausalLM"), copies=tied_head("embed_in.weight"), rename=modern_name,
    export=export, export_when=(("position.kind", "rope"), ("normalization.kind", "layernorm")),
)
