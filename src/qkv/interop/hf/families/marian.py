"""Marian (Junczys-Dowmunt et al. 2018; opus-mt, Tiedemann & Thottingal 2020): the paper's encoder-decoder.

Split-layout sinusoids · post-LN · swish · one embedding shared by encoder, decoder and output · a
logits bias. Also here: the tokens Hugging Face's ``generate`` decodes a Marian checkpoint with
(``marian_special``), as a ``qkv.beam_search.Special``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ....generation.beam_search import Special, special_of
from ....generation.config import NEUTRAL, GenerationConfig
from ....models import ModelConfig, Transformer
from ..family import Family
from ..files import generation_settings
from ..rules import HEAD, LOGITS_BIAS, Rule, same, shared
from ..settings import (expect, expect_biases, expect_plain_blocks, expect_whole_heads, export_activation,
                        read_activation, require, uniform_biases)

LEGACY = dict(normalize_before=False, normalize_embedding=False, layernorm_embedding=False,
              add_final_layer_norm=False, add_bias_logits=False, static_position_embeddings=True,
              is_decoder=False)  # BART-era keys old opus-mt config.json files still carry
ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")
LAYER = tuple((f"self_attn.{p}", f"attn.{p}") for p in ATTENTION) + (
    ("self_attn_layer_norm", "attn_norm"), ("fc1", "ff.up_proj"), ("fc2", "ff.down_proj"),
    ("final_layer_norm", "ff_norm"))
CROSS = tuple((f"encoder_attn.{p}", f"cross_attn.{p}") for p in ATTENTION) + (("encoder_attn_layer_norm", "cross_norm"),)


def one_shape(hf: dict, problems: list[str]) -> None:
    """qkv's encoder and decoder share block shapes and a vocabulary; Marian's config could differ."""
    for enc, dec, default in (("encoder_attention_heads", "decoder_attention_heads", 16),
                              ("encoder_ffn_dim", "decoder_ffn_dim", 4096)):
        if hf.get(enc, default) != hf.get(dec, default):
            problems.append(f"{enc}={hf.get(enc, default)!r} differs from {dec}={hf.get(dec, default)!r} "
                            "(qkv's encoder and decoder blocks have one shape)")
    vocab = hf.get("vocab_size", 58101)
    if hf.get("decoder_vocab_size") not in (None, vocab):
        problems.append(f"decoder_vocab_size={hf['decoder_vocab_size']!r} differs from vocab_size={vocab!r} "
                        "(qkv's encoder and decoder share one vocabulary)")


def config(hf: dict, problems: list[str]) -> dict:
    """MarianConfig -> ModelConfig arguments."""
    require(hf, problems, **LEGACY)
    one_shape(hf, problems)
    share, tie = hf.get("share_encoder_decoder_embeddings", True), hf.get("tie_word_embeddings", True)
    if share != tie:
        problems.append(f"share_encoder_decoder_embeddings={share!r} with tie_word_embeddings={tie!r} is not "
                        "supported (qkv ties the encoder, decoder and output embeddings all together, or none)")
    return dict(
        vocab_size=hf.get("vocab_size", 58101), d_model=hf.get("d_model", 1024),
        num_layers=hf.get("encoder_layers", 12), num_decoder_layers=hf.get("decoder_layers", 12),
        max_len=hf.get("max_position_embeddings", 1024),
        attention=dict(num_heads=hf.get("encoder_attention_heads", 16), **uniform_biases(True)),
        position=dict(kind="sinusoidal", sinusoidal_layout="split"),
        feed_forward=dict(d_ff=hf.get("encoder_ffn_dim", 4096), bias=True,
                          activation=read_activation(hf, "activation_function", "gelu", problems)),
        normalization=dict(kind="layernorm", eps=1e-5, first=False, final=False),  # eps: nn.LayerNorm's (no key)
        embedding=dict(scale=hf.get("scale_embedding", False)),
        head=dict(tie=share is True and tie is True, bias=True),
    )


def logits_bias(c: ModelConfig) -> Rule:
    """final_logits_bias (1, V) <-> lm_head.bias (V,). A qkv model without it is Marian with zeros there."""
    if c.head.bias:
        return Rule(LOGITS_BIAS, ("lm_head.bias",), lambda t: (t.reshape(-1),), lambda ts: ts[0][None])
    return Rule(LOGITS_BIAS, (), lambda t: (), lambda ts: torch.zeros(1, c.vocab_size))


def rules(c: ModelConfig) -> list[Rule]:
    if c.head.tie:  # one matrix: source and target embeddings and the output projection (§3.4)
        out = [shared("shared.weight", ("encoder.embed.tok.weight", "embed.tok.weight", HEAD))]
    else:
        out = [same("encoder.embed_tokens.weight", "encoder.embed.tok.weight"),
               same("decoder.embed_tokens.weight", "embed.tok.weight"), same(HEAD, HEAD)]
    out.append(logits_bias(c))
    for side, qkv, n, table in (("encoder", "encoder.blocks", c.num_layers, LAYER),
                                ("decoder", "blocks", c.num_decoder_layers or c.num_layers, LAYER + CROSS)):
        out += [same(f"{side}.layers.{i}.{hf}.{p}", f"{qkv}.{i}.{q}.{p}")
                for i in range(n) for hf, q in table for p in ("weight", "bias")]
    return out


def copies(c: ModelConfig) -> dict[str, str]:
    """The names HF's state dict also gives the shared embedding (save_pretrained keeps only one)."""
    names = (HEAD, "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    return dict.fromkeys(names, "shared.weight") if c.head.tie else {}


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> MarianConfig fields, appending whatever Marian has no counterpart for."""
    expect(c, problems, {"position.kind": "sinusoidal", "position.sinusoidal_layout": "split",
                         "normalization.first": False, "normalization.kind": "layernorm", "normalization.eps": 1e-5})
    expect_biases(c, problems, "Marian")
    expect(c, problems, {"embedding.type_vocab_size": 0, "embedding.norm": False})
    problems += ["normalization.final=True (Marian has none)"] if c.has_final_norm else []
    expect_plain_blocks(c, problems)
    expect_whole_heads(c, problems, "Marian")
    activation = export_activation(c, problems, gated=False, prefer=("swish",))
    return dict(
        vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model, max_position_embeddings=c.max_len,
        encoder_layers=c.num_layers, decoder_layers=c.num_decoder_layers or c.num_layers,
        encoder_attention_heads=c.attention.num_heads, decoder_attention_heads=c.attention.num_heads,
        encoder_ffn_dim=c.ff_width, decoder_ffn_dim=c.ff_width, activation_function=activation,
        scale_embedding=c.embedding.scale, share_encoder_decoder_embeddings=c.head.tie,
        tie_word_embeddings=c.head.tie, dropout=c.dropout, attention_dropout=c.dropout, activation_dropout=c.dropout,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, forced_eos_token_id=None,
        decoder_start_token_id=0,  # MarianConfig insists on an int: pass the real one (Marian's is its pad id)
    )


# --- how Hugging Face decodes a Marian checkpoint ---------------------------------------------------

# generate settings a Special cannot express, at their neutral values (GenerationConfig lists the others it meets)
UNSUPPORTED_SEARCH = dict(NEUTRAL, do_sample=False)


def marian_special(source: str | os.PathLike | dict) -> Special:
    """The tokens Hugging Face's ``generate`` decodes a Marian checkpoint with, as a ``Special``.

    start = decoder_start_token_id (Marian's pad), eos = eos_token_id, pad = pad_token_id,
    suppress = single-token bad_words_ids (Marian's pad) and suppress_tokens, force_eos_at_end =
    forced_eos_token_id is set, renormalize = renormalize_logits. ``source``: a checkpoint
    directory (generation_config.json over config.json) or those settings as one dict.
    Raises ValueError listing every missing id and every setting a Special cannot express (where
    ``from_hf``'s ``model.generation_config`` only warns).
    """
    hf = source if isinstance(source, dict) else generation_settings(Path(source))
    hf, problems = {k: v for k, v in hf.items() if v is not None}, []  # None: unset (GenerationConfig.to_dict)
    vocab = hf.get("decoder_vocab_size") or hf.get("vocab_size", 58101)
    settings = GenerationConfig.from_hf(hf, vocab if isinstance(vocab, int) else 0)
    problems += [p for p in settings.ignored if not p.startswith("eos_token_id=")]  # said once, below
    require(hf, problems, do_sample=UNSUPPORTED_SEARCH["do_sample"])
    said, eos = {p.split("=")[0] for p in problems}, hf.get("eos_token_id")
    lacking = dict(decoder_start_token_id=settings.decoder_start_id is None, pad_token_id=settings.pad_id is None,
                   eos_token_id=len(settings.eos_ids) != 1 or isinstance(eos, list) and len(eos) > 1)
    problems += [f"{k}={hf.get(k)!r} (expected one token id in [0, {vocab}))"
                 for k, bad in lacking.items() if bad and k not in said]
    if None not in (settings.forced_eos_id, settings.eos_id) and settings.forced_eos_id != settings.eos_id:
        problems.append(f"forced_eos_token_id={settings.forced_eos_id} differs from eos_token_id={settings.eos_id} "
                        "(qkv forces its EOS)")
    if problems:
        raise ValueError("cannot decode as Hugging Face's generate does: " + "; ".join(problems))
    return special_of(settings)


FAMILY = Family(
    model_type="marian", name="Marian", model=Transformer, base="model", config=config, rules=rules,
    ignored=re.compile(r"(model\.)?(encoder|decoder)\.embed_positions\.weight"),  # HF recomputes its sinusoids
    hf_classes=("MarianConfig", "MarianMTModel"), copies=copies, top_level=(HEAD, LOGITS_BIAS),
    export=export, special=marian_special,
)
