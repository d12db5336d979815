"""Hugging Face GPT-2, LLaMA, BERT and Marian checkpoints as qkv models, and qkv models as Hugging Face ones.

A checkpoint becomes two things in qkv's terms: a ``ModelConfig`` (what the HF config
means — widths, norm, activation, positional scheme) and a table of weight ``Rule``s,
each tying one HF tensor to one or more qkv tensors with the layout change between them.
Nothing model-specific runs inside qkv's attention:

    GPT-2  learned PE · pre-LN LayerNorm · gelu_tanh · biases · tied head; Conv1D stores W
           transposed and packs Q, K, V in one c_attn (Radford et al. 2019)
    LLaMA  RoPE half-split (rope_theta) · RMSNorm · SwiGLU · grouped K/V heads · no biases
           (Touvron et al. 2023)
    BERT   learned PE + token types + embedding LayerNorm · post-LN · gelu (Devlin et al. 2019)
    Marian the paper's encoder-decoder: split-layout sinusoids · post-LN · swish · shared embeddings ·
           a logits bias (Junczys-Dowmunt et al. 2018; opus-mt, Tiedemann & Thottingal 2020)

Weights are read with safetensors, never unpickled. Every problem found — unsupported
settings, missing or unexpected keys, shape mismatches — is reported together in one
ValueError before any model is returned.

Shapes: C model width, F feed-forward width, V vocabulary, H heads, G key/value heads,
D head width (C / H).
"""
from __future__ import annotations

import json
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from ...generation.beam_search import Special
from ...models import GPT, Encoder, ModelConfig, Transformer
from ...models.pointer import PointerTransformer

HEAD = "lm_head.weight"  # weights outside the base model (GPT2LMHeadModel.transformer, MarianMTModel.model, …)
LOGITS_BIAS = "final_logits_bias"  # MarianMTModel's (1, V) buffer added to the logits
TOP_LEVEL = (HEAD, LOGITS_BIAS)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


@dataclass(frozen=True)
class Rule:
    """One HF tensor <-> one or more qkv tensors; ``to_hf`` is the exact inverse of ``to_qkv``."""

    hf: str  # relative to the base model ("h.0.ln_1.weight"), except TOP_LEVEL keys
    qkv: tuple[str, ...]
    to_qkv: Callable[[Tensor], tuple[Tensor, ...]]
    to_hf: Callable[[tuple[Tensor, ...]], Tensor]


def _same(hf: str, qkv: str) -> Rule:
    return Rule(hf, (qkv,), lambda t: (t,), lambda ts: ts[0])


def _shared(hf: str, qkv: tuple[str, ...]) -> Rule:
    """One HF matrix that several tied qkv names hold (a tied embedding and LM head)."""
    return Rule(hf, qkv, lambda t: (t,) * len(qkv), lambda ts: ts[0])


def _full(key: str, prefix: str) -> str:
    """A rule's key as it appears in the task model's state dict."""
    return key if key in TOP_LEVEL else prefix + key


def _conv1d(hf: str, qkv: str) -> Rule:
    """GPT-2's Conv1D holds W as (in, out); nn.Linear as (out, in)."""
    return Rule(hf, (qkv,), lambda t: (t.t(),), lambda ts: ts[0].t())


def _packed_qkv(hf: str, qkv: tuple[str, str, str]) -> Rule:
    """GPT-2's c_attn: weight (C, 3C) = [W_Qᵀ | W_Kᵀ | W_Vᵀ], bias (3C,) = [b_Q | b_K | b_V]."""
    if hf.endswith(".weight"):
        return Rule(hf, qkv, lambda t: tuple(w.t() for w in t.chunk(3, dim=1)),  # (C, 3C) -> 3 × (C, C)
                    lambda ts: torch.cat([w.t() for w in ts], dim=1))
    return Rule(hf, qkv, lambda t: t.chunk(3), lambda ts: torch.cat(ts))


def interleaved_to_half_split(w: Tensor, num_heads: int) -> Tensor:
    """Reorder q/k projection rows (H·D, …) so that half-split RoPE computes what interleaved RoPE did.

    In each head, row 2i (rotated with row 2i+1) moves to i and row 2i+1 to i + D/2: the
    permutation of Meta's LLaMA → Hugging Face conversion (convert_llama_weights_to_hf.py).
    """
    D = w.size(0) // num_heads
    return w.reshape(num_heads, D // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (H, D/2, 2, …) -> (H, 2, D/2, …)


def half_split_to_interleaved(w: Tensor, num_heads: int) -> Tensor:
    """The inverse of ``interleaved_to_half_split``."""
    D = w.size(0) // num_heads
    return w.reshape(num_heads, 2, D // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (H, 2, D/2, …) -> (H, D/2, 2, …)


def _rope_rows(hf: str, qkv: str, heads: int) -> Rule:
    """A q/k projection of a qkv model with interleaved RoPE, stored half-split as HF LLaMA expects."""
    return Rule(hf, (qkv,), lambda t: (half_split_to_interleaved(t, heads),),
                lambda ts: interleaved_to_half_split(ts[0], heads))


def _embedding_and_head(c: ModelConfig, hf: str) -> list[Rule]:
    """A decoder-only model's token embedding and LM head: one tied matrix, or two."""
    if c.tie_embeddings:
        return [_shared(hf, ("embed.tok.weight", HEAD))]
    return [_same(hf, "embed.tok.weight"), _same(HEAD, HEAD)]


def _tied_head(hf: str) -> Callable[[ModelConfig], dict[str, str]]:
    return lambda c: {HEAD: hf} if c.tie_embeddings else {}


# --- the three families: HF config -> ModelConfig fields, and weight rules ------------------------

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "silu": "silu", "swish": "silu"}  # HF name -> qkv FeedForward activation
GATED = {"silu": "swiglu", "gelu": "geglu"}  # LLaMA's hidden_act names the gate's activation
GPT2_ACT_NAME = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}  # qkv -> HF
LLAMA_ACT_NAME = {v: k for k, v in GATED.items()}


def _activation(hf: dict, key: str, default: str, table: dict, problems: list[str]) -> str:
    name = hf.get(key, default)
    if name not in table:
        problems.append(f"{key}={name!r} is not supported (qkv knows {sorted(table)})")
    return table.get(name, next(iter(table.values())))


def _require(hf: dict, problems: list[str], **needed) -> None:
    """Settings qkv has no counterpart for must keep their default."""
    for key, want in needed.items():
        if hf.get(key, want) != want:
            problems.append(f"{key}={hf[key]!r} is not supported (qkv needs {want!r})")


def _gpt2_config(hf: dict, problems: list[str]) -> dict:
    _require(hf, problems, add_cross_attention=False, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False)
    return dict(
        vocab_size=hf.get("vocab_size", 50257), d_model=hf.get("n_embd", 768), num_heads=hf.get("n_head", 12),
        num_layers=hf.get("n_layer", 12), d_ff=hf.get("n_inner"), max_len=hf.get("n_positions", 1024),
        positional="learned", norm_first=True, norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=_activation(hf, "activation_function", "gelu_new", ACTIVATIONS, problems),
        bias=True, tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def _gpt2_rules(c: ModelConfig) -> list[Rule]:
    rules = _embedding_and_head(c, "wte.weight") + [
        _same("wpe.weight", "embed.pos.weight"), _same("ln_f.weight", "final_norm.weight"),
        _same("ln_f.bias", "final_norm.bias")]
    for i in range(c.num_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        rules += [_packed_qkv(f"{h}attn.c_attn.{p}", tuple(f"{b}attn.{n}_proj.{p}" for n in "qkv"))
                  for p in ("weight", "bias")]
        rules += [_conv1d(h + hf, b + q) for hf, q in (("attn.c_proj.weight", "attn.out_proj.weight"),
                                                       ("mlp.c_fc.weight", "ff.up_proj.weight"),
                                                       ("mlp.c_proj.weight", "ff.down_proj.weight"))]
        rules += [_same(h + hf, b + q) for hf, q in (
            ("ln_1.weight", "attn_norm.weight"), ("ln_1.bias", "attn_norm.bias"), ("attn.c_proj.bias", "attn.out_proj.bias"),
            ("ln_2.weight", "ff_norm.weight"), ("ln_2.bias", "ff_norm.bias"),
            ("mlp.c_fc.bias", "ff.up_proj.bias"), ("mlp.c_proj.bias", "ff.down_proj.bias"))]
    return rules


def _llama_config(hf: dict, problems: list[str]) -> dict:
    heads, width = hf.get("num_attention_heads", 32), hf.get("hidden_size", 4096)
    kv_heads = hf.get("num_key_value_heads") or heads
    sizes_ok = isinstance(heads, int) and isinstance(width, int) and heads > 0
    if hf.get("head_dim") is not None and sizes_ok and hf["head_dim"] != width // heads:
        problems.append(f"head_dim={hf['head_dim']} differs from hidden_size / num_attention_heads = "
                        f"{width // heads} (qkv needs them equal)")
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        problems.append(f"attention_bias={hf.get('attention_bias')} and mlp_bias={hf.get('mlp_bias')} differ "
                        "(qkv has one bias setting)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}  # transformers 5 / 4 spelling
    if not isinstance(rope, dict):
        problems.append(f"rope parameters must be a JSON object, got {rope!r}")
        rope = {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        problems.append(f"RoPE scaling {rope_type!r} is not supported (qkv implements plain RoPE)")
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        problems.append(f"partial_rotary_factor={partial} is not supported (qkv rotates the whole head)")
    return dict(
        vocab_size=hf.get("vocab_size", 32000), d_model=width, num_heads=heads,
        num_kv_heads=None if kv_heads == heads else kv_heads, num_layers=hf.get("num_hidden_layers", 32),
        d_ff=hf.get("intermediate_size", 11008), max_len=hf.get("max_position_embeddings", 2048),
        positional="rope", rope_base=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        norm_first=True, norm="rmsnorm", norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=_activation(hf, "hidden_act", "silu", GATED, problems),
        bias=hf.get("attention_bias", False), tie_embeddings=hf.get("tie_word_embeddings", False),
    )


def _llama_rules(c: ModelConfig) -> list[Rule]:
    rules = _embedding_and_head(c, "embed_tokens.weight") + [_same("norm.weight", "final_norm.weight")]
    rope_heads = {"attn.q_proj": c.num_heads, "attn.k_proj": c.num_kv_heads or c.num_heads}
    for i in range(c.num_layers):
        l, b = f"layers.{i}.", f"blocks.{i}."
        rules += [_same(l + "input_layernorm.weight", b + "attn_norm.weight"),
                  _same(l + "post_attention_layernorm.weight", b + "ff_norm.weight")]
        for hf, q in (("self_attn.q_proj", "attn.q_proj"), ("self_attn.k_proj", "attn.k_proj"),
                      ("self_attn.v_proj", "attn.v_proj"), ("self_attn.o_proj", "attn.out_proj"),
                      ("mlp.gate_proj", "ff.gate_proj"), ("mlp.up_proj", "ff.up_proj"), ("mlp.down_proj", "ff.down_proj")):
            for p in ("weight", "bias") if c.bias else ("weight",):
                permute = c.rope_interleaved and q in rope_heads
                rules.append(_rope_rows(f"{l}{hf}.{p}", f"{b}{q}.{p}", rope_heads[q]) if permute
                             else _same(f"{l}{hf}.{p}", f"{b}{q}.{p}"))
    return rules


def _bert_config(hf: dict, problems: list[str]) -> dict:
    _require(hf, problems, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False)
    return dict(
        vocab_size=hf.get("vocab_size", 30522), d_model=hf.get("hidden_size", 768),
        num_heads=hf.get("num_attention_heads", 12), num_layers=hf.get("num_hidden_layers", 12),
        d_ff=hf.get("intermediate_size", 3072), max_len=hf.get("max_position_embeddings", 512),
        positional="learned", norm_first=False, norm="layernorm", norm_eps=hf.get("layer_norm_eps", 1e-12),
        activation=_activation(hf, "hidden_act", "gelu", ACTIVATIONS, problems), bias=True,
        type_vocab_size=hf.get("type_vocab_size", 2), embedding_norm=True, tie_embeddings=False,
    )


_BERT_LAYER = (("attention.self.query", "attn.q_proj"), ("attention.self.key", "attn.k_proj"),
               ("attention.self.value", "attn.v_proj"), ("attention.output.dense", "attn.out_proj"),
               ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "ff.up_proj"),
               ("output.dense", "ff.down_proj"), ("output.LayerNorm", "ff_norm"))


def _bert_rules(c: ModelConfig) -> list[Rule]:
    embeddings = [("word_embeddings", "tok"), ("position_embeddings", "pos")]
    embeddings += [("token_type_embeddings", "token_type")] if c.type_vocab_size else []
    rules = [_same(f"embeddings.{hf}.weight", f"embed.{q}.weight") for hf, q in embeddings]
    rules += [_same(f"embeddings.LayerNorm.{p}", f"embed.norm.{p}") for p in ("weight", "bias")]
    for i in range(c.num_layers):
        rules += [_same(f"encoder.layer.{i}.{hf}.{p}", f"blocks.{i}.{q}.{p}")
                  for hf, q in _BERT_LAYER for p in ("weight", "bias")]
    return rules


MARIAN_LEGACY = dict(normalize_before=False, normalize_embedding=False, layernorm_embedding=False,
                     add_final_layer_norm=False, add_bias_logits=False, static_position_embeddings=True,
                     is_decoder=False)  # BART-era keys old opus-mt config.json files still carry


def _marian_config(hf: dict, problems: list[str]) -> dict:
    _require(hf, problems, **MARIAN_LEGACY)
    for enc, dec, default in (("encoder_attention_heads", "decoder_attention_heads", 16),
                              ("encoder_ffn_dim", "decoder_ffn_dim", 4096)):
        if hf.get(enc, default) != hf.get(dec, default):
            problems.append(f"{enc}={hf.get(enc, default)!r} differs from {dec}={hf.get(dec, default)!r} "
                            "(qkv's encoder and decoder blocks have one shape)")
    vocab = hf.get("vocab_size", 58101)
    if hf.get("decoder_vocab_size") not in (None, vocab):
        problems.append(f"decoder_vocab_size={hf['decoder_vocab_size']!r} differs from vocab_size={vocab!r} "
                        "(qkv's encoder and decoder share one vocabulary)")
    share, tie = hf.get("share_encoder_decoder_embeddings", True), hf.get("tie_word_embeddings", True)
    if share != tie:
        problems.append(f"share_encoder_decoder_embeddings={share!r} with tie_word_embeddings={tie!r} is not "
                        "supported (qkv ties the encoder, decoder and output embeddings all together, or none)")
    return dict(
        vocab_size=vocab, d_model=hf.get("d_model", 1024), num_heads=hf.get("encoder_attention_heads", 16),
        num_layers=hf.get("encoder_layers", 12), num_decoder_layers=hf.get("decoder_layers", 12),
        d_ff=hf.get("encoder_ffn_dim", 4096), max_len=hf.get("max_position_embeddings", 1024),
        positional="sinusoidal", sinusoidal_layout="split", norm_first=False, norm="layernorm",
        norm_eps=1e-5,  # MarianMTModel's nn.LayerNorm default; its config has no epsilon
        activation=_activation(hf, "activation_function", "gelu", ACTIVATIONS, problems), bias=True,
        tie_embeddings=share is True and tie is True, scale_embeddings=hf.get("scale_embedding", False),
        logits_bias=True,
    )


_ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")
_MARIAN_LAYER = tuple((f"self_attn.{p}", f"attn.{p}") for p in _ATTENTION) + (
    ("self_attn_layer_norm", "attn_norm"), ("fc1", "ff.up_proj"), ("fc2", "ff.down_proj"),
    ("final_layer_norm", "ff_norm"))
_MARIAN_CROSS = tuple((f"encoder_attn.{p}", f"cross_attn.{p}") for p in _ATTENTION) + (
    ("encoder_attn_layer_norm", "cross_norm"),)


def _logits_bias(c: ModelConfig) -> Rule:
    """final_logits_bias (1, V) <-> lm_head.bias (V,). A qkv model without it is Marian with zeros there."""
    if c.logits_bias:
        return Rule(LOGITS_BIAS, ("lm_head.bias",), lambda t: (t.reshape(-1),), lambda ts: ts[0][None])
    return Rule(LOGITS_BIAS, (), lambda t: (), lambda ts: torch.zeros(1, c.vocab_size))


def _marian_rules(c: ModelConfig) -> list[Rule]:
    if c.tie_embeddings:  # one matrix: source and target embeddings and the output projection (§3.4)
        rules = [_shared("shared.weight", ("encoder.embed.tok.weight", "embed.tok.weight", HEAD))]
    else:
        rules = [_same("encoder.embed_tokens.weight", "encoder.embed.tok.weight"),
                 _same("decoder.embed_tokens.weight", "embed.tok.weight"), _same(HEAD, HEAD)]
    rules.append(_logits_bias(c))
    for side, qkv, n, table in (("encoder", "encoder.blocks", c.num_layers, _MARIAN_LAYER),
                                ("decoder", "blocks", c.num_decoder_layers or c.num_layers,
                                 _MARIAN_LAYER + _MARIAN_CROSS)):
        rules += [_same(f"{side}.layers.{i}.{hf}.{p}", f"{qkv}.{i}.{q}.{p}")
                  for i in range(n) for hf, q in table for p in ("weight", "bias")]
    return rules


def _marian_copies(c: ModelConfig) -> dict[str, str]:
    """The names HF's state dict also gives the shared embedding (save_pretrained keeps only one)."""
    names = (HEAD, "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    return dict.fromkeys(names, "shared.weight") if c.tie_embeddings else {}


@dataclass(frozen=True)
class Family:
    """How one HF model_type maps onto qkv."""

    base: str  # the base model's attribute in the task models (GPT2LMHeadModel.transformer, …)
    model: type  # qkv.GPT, qkv.Encoder or qkv.Transformer
    config: Callable[[dict, list[str]], dict]  # HF config -> ModelConfig fields, appending problems
    rules: Callable[[ModelConfig], list[Rule]]
    ignored: re.Pattern  # keys that are no weights of qkv's model: buffers, heads qkv does not model
    copies: Callable[[ModelConfig], dict[str, str]] = lambda c: {}  # tied key -> the rule key it must equal


FAMILIES = {
    "gpt2": Family("transformer", GPT, _gpt2_config, _gpt2_rules,
                   re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias"),  # old causal-mask buffers
                   _tied_head("wte.weight")),
    "llama": Family("model", GPT, _llama_config, _llama_rules,
                    re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq"),
                    _tied_head("embed_tokens.weight")),
    "bert": Family("bert", Encoder, _bert_config, _bert_rules,  # the pooler and MLM/NSP heads are not loaded
                   re.compile(r"(bert\.)?(embeddings\.position_ids|pooler\..+)|cls\..+")),
    "marian": Family("model", Transformer, _marian_config, _marian_rules,  # HF recomputes its sinusoid tables
                     re.compile(r"(model\.)?(encoder|decoder)\.embed_positions\.weight"), _marian_copies),
}


# --- loading ----------------------------------------------------------------------------------------

def _listing(label: str, items: list[str], most: int = 6) -> str:
    shown = ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")
    return f"{len(items)} {label}: {shown}"


def _fail(name: str, model_type: str, problems: list[str]) -> ValueError:
    """All problems in one line (the command prints the first line of an error)."""
    return ValueError(f"cannot load {name} as {model_type}: " + "; ".join(problems))


LEGACY = re.compile(r"(.*\.LayerNorm)\.(gamma|beta)")


def _modern_name(key: str) -> str:
    """TF-era BERT checkpoints call LayerNorm parameters gamma/beta (HF renames them on load too)."""
    m = LEGACY.fullmatch(key)
    return key if m is None else f"{m[1]}.{'weight' if m[2] == 'gamma' else 'bias'}"


def _differing_copies(tensors: dict[str, Tensor], copies: dict[str, str]) -> list[str]:
    """Tied keys present in the checkpoint must hold exactly the tensor they are tied to."""
    return [f"{key} differs from the token embedding {src} although the checkpoint ties them"
            for key, src in copies.items() if key in tensors and src in tensors
            and (tensors[key].shape != tensors[src].shape or not torch.equal(tensors[key], tensors[src]))]


def _convert(tensors: dict[str, Tensor], family: Family, config: ModelConfig, own: dict[str, Tensor],
             problems: list[str]) -> dict[str, Tensor]:
    """HF tensors -> qkv state dict; every missing/unexpected key and shape mismatch goes to problems."""
    tensors = {_modern_name(k): t for k, t in tensors.items()}
    prefix = family.base + "." if any(k.startswith(family.base + ".") for k in tensors) else ""
    rules = {_full(r.hf, prefix): r for r in family.rules(config)}
    copies = {_full(k, prefix): _full(src, prefix) for k, src in family.copies(config).items()}
    for key, src in copies.items():  # a file may keep any one of the tied names
        if src not in tensors and key in tensors:
            tensors[src] = tensors[key]
    missing = [k for k in rules if k not in tensors]
    unexpected = [k for k in tensors if k not in rules and k not in copies and not family.ignored.fullmatch(k)]
    wrong, out = [], {}
    for key, rule in rules.items():
        if key not in tensors:
            continue
        t = tensors[key]
        want = tuple(rule.to_hf(tuple(own[q] for q in rule.qkv)).shape)
        if tuple(t.shape) != want or not t.is_floating_point():
            wrong.append(f"{key} {t.dtype} {tuple(t.shape)} (expected floating {want})")
            continue
        out.update(zip(rule.qkv, rule.to_qkv(t)))
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong)):
        if items:
            problems.append(_listing(label, items))
    problems += _differing_copies(tensors, copies)
    return out


def _build(hf_config: dict, load: Callable[[], dict[str, Tensor]], name: str, *,
           dtype: torch.dtype, dropout: float) -> GPT | Encoder | Transformer:
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"cannot load {name}: model_type {model_type!r} is not supported "
                         f"(qkv loads {', '.join(sorted(FAMILIES))})")
    family, problems = FAMILIES[model_type], []
    fields = family.config(hf_config, problems)
    try:
        config = ModelConfig.from_dict({**fields, "dropout": dropout})
    except (ValueError, TypeError) as e:
        problems.append(str(e))
    if problems:
        raise _fail(name, model_type, problems)
    with torch.device("meta"):  # shapes only: nothing is allocated before the checkpoint passes
        skeleton = family.model(config).state_dict()
    state = _convert(load(), family, config, skeleton, problems)
    if problems:
        raise _fail(name, model_type, problems)
    model = family.model(config)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def _read_safetensors(d: Path) -> dict[str, Tensor]:
    """model.safetensors, or the shards a model.safetensors.index.json names."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    elif index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"cannot read {index}: {e}") from None
        bad = [n for n in names if not isinstance(n, str) or Path(n).name != n or not (d / n).is_file()]
        if bad:
            raise ValueError(f"{index} names shards that are not files in {d}: {bad}")
        files = [d / n for n in names]
    else:
        found = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" (found {', '.join(found)}: pickle files, which qkv never unpickles)" if found else ""
        raise ValueError(f"{d} has no model.safetensors{hint}; save with save_pretrained(..., safe_serialization=True)")
    tensors: dict[str, Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (OSError, SafetensorError) as e:
            raise ValueError(f"cannot read {f}: {e}") from None
    return tensors


def _read_json_object(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def _read_config(d: Path) -> dict:
    if not d.is_dir():
        raise ValueError(f"{d} is not a directory (expected one written by save_pretrained)")
    path = d / "config.json"
    if not path.is_file():
        raise ValueError(f"{d} has no config.json (expected a directory written by save_pretrained)")
    return _read_json_object(path)


def from_hf(source: str | os.PathLike | nn.Module, *, dtype: torch.dtype = torch.float32,
            dropout: float = 0.0) -> GPT | Encoder | Transformer:
    """A qkv model with the weights of a Hugging Face GPT-2, LLaMA, BERT or Marian checkpoint.

    Args:
        source: a directory written by ``save_pretrained`` (config.json + model.safetensors,
            possibly sharded), or an in-memory ``transformers`` model.
        dtype: the returned model's dtype.
        dropout: qkv's one dropout rate (HF's several rates are training settings, not loaded).
    Returns:
        ``qkv.GPT`` (gpt2, llama), ``qkv.Encoder`` (bert, without pooler or MLM head) or
        ``qkv.Transformer`` (marian: MarianMTModel), in eval mode.
    Raises:
        ValueError listing every problem at once: no config.json, unsupported model_type or
        setting, missing or unexpected keys, shape mismatches.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if isinstance(source, (str, os.PathLike)):
        d = Path(source)
        return _build(_read_config(d), lambda: _read_safetensors(d), str(d), dtype=dtype, dropout=dropout)
    if isinstance(source, nn.Module) and hasattr(getattr(source, "config", None), "to_dict"):
        return _build(source.config.to_dict(), source.state_dict, type(source).__name__, dtype=dtype, dropout=dropout)
    raise TypeError(f"from_hf expects a directory path or a transformers model, got {type(source).__name__}")


# --- saving -----------------------------------------------------------------------------------------

def _hf_config(c: ModelConfig) -> tuple[str, dict]:
    """The HF model_type and config fields for a qkv GPT; ValueError listing whatever has no HF counterpart."""
    if c.positional not in ("learned", "rope"):
        raise ValueError(f"to_hf needs positional='learned' (GPT-2) or 'rope' (LLaMA), got {c.positional!r}")
    gpt2 = c.positional == "learned"
    problems = [f"{k}={getattr(c, k)!r} (needs {want!r})" for k, want in (
        ("norm_first", True), ("type_vocab_size", 0), ("embedding_norm", False), ("scale_embeddings", False),
        ("norm", "layernorm" if gpt2 else "rmsnorm")) if getattr(c, k) != want]
    problems += [] if c.has_final_norm else ["final_norm=False (needs a final norm)"]
    acts = GPT2_ACT_NAME if gpt2 else LLAMA_ACT_NAME
    problems += [] if c.activation in acts else [f"activation={c.activation!r} (needs one of {sorted(acts)})"]
    if gpt2:
        problems += [] if c.bias else ["bias=False (GPT-2 has biases)"]
        problems += [] if c.num_kv_heads in (None, c.num_heads) else [f"num_kv_heads={c.num_kv_heads} (GPT-2 has none)"]
    if problems:
        raise ValueError(f"no Hugging Face {'GPT-2' if gpt2 else 'LLaMA'} counterpart for this model: " + "; ".join(problems))
    shared = dict(vocab_size=c.vocab_size, tie_word_embeddings=c.tie_embeddings,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if gpt2:
        return "gpt2", dict(shared, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.num_layers, n_head=c.num_heads,
                            n_inner=c.d_ff, activation_function=acts[c.activation], layer_norm_epsilon=c.norm_eps,
                            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout)
    return "llama", dict(shared, hidden_size=c.d_model, intermediate_size=c.ff_width, num_hidden_layers=c.num_layers,
                         num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads or c.num_heads,
                         head_dim=c.head_dim, hidden_act=acts[c.activation], max_position_embeddings=c.max_len,
                         rms_norm_eps=c.norm_eps, rope_theta=c.rope_base,
                         attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.dropout)


MARIAN_ACT_NAME = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "swish"}  # qkv -> HF


def _marian_hf_config(c: ModelConfig) -> tuple[str, dict]:
    """MarianConfig fields for a qkv Transformer; ValueError listing whatever has no Marian counterpart."""
    problems = [f"{k}={getattr(c, k)!r} (needs {want!r})" for k, want in (
        ("positional", "sinusoidal"), ("sinusoidal_layout", "split"), ("norm_first", False), ("norm", "layernorm"),
        ("norm_eps", 1e-5), ("bias", True), ("type_vocab_size", 0), ("embedding_norm", False))
        if getattr(c, k) != want]
    problems += ["final_norm=True (Marian has none)"] if c.has_final_norm else []
    problems += [] if c.num_kv_heads in (None, c.num_heads) else [f"num_kv_heads={c.num_kv_heads} (Marian has none)"]
    problems += [] if c.activation in MARIAN_ACT_NAME else [
        f"activation={c.activation!r} (needs one of {sorted(MARIAN_ACT_NAME)})"]
    if problems:
        raise ValueError("no Hugging Face Marian counterpart for this model: " + "; ".join(problems))
    return "marian", dict(
        vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model, max_position_embeddings=c.max_len,
        encoder_layers=c.num_layers, decoder_layers=c.num_decoder_layers or c.num_layers,
        encoder_attention_heads=c.num_heads, decoder_attention_heads=c.num_heads, encoder_ffn_dim=c.ff_width,
        decoder_ffn_dim=c.ff_width, activation_function=MARIAN_ACT_NAME[c.activation], scale_embedding=c.scale_embeddings,
        share_encoder_decoder_embeddings=c.tie_embeddings, tie_word_embeddings=c.tie_embeddings,
        dropout=c.dropout, attention_dropout=c.dropout, activation_dropout=c.dropout,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, forced_eos_token_id=None,
        decoder_start_token_id=0,  # MarianConfig insists on an int: pass the real one (Marian's is its pad id)
    )


HF_TASK_MODELS = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
                  "marian": ("MarianConfig", "MarianMTModel")}


def to_hf(model: GPT | Transformer, **config_kwargs) -> nn.Module:
    """A ``transformers`` GPT2LMHeadModel, LlamaForCausalLM or MarianMTModel holding exact copies of ``model``'s weights.

    learned PE + LayerNorm → GPT-2; RoPE + RMSNorm + swiglu/geglu → LLaMA (interleaved RoPE is
    stored half-split, q/k rows permuted); a post-LN Transformer with split sinusoids → Marian
    (no logits bias: a zero final_logits_bias). ``config_kwargs`` go to the HF config (e.g.
    ``eos_token_id=…``, ``attn_implementation="eager"``); special-token ids default to None.
    """
    if not isinstance(model, (GPT, Transformer)):
        raise TypeError(f"to_hf converts a qkv.GPT (to GPT-2 or LLaMA) or a qkv.Transformer (to Marian), "
                        f"got {type(model).__name__}")
    if isinstance(model, PointerTransformer):
        raise TypeError(f"{type(model).__name__}'s copy mechanism has no Hugging Face counterpart; "
                        "to_hf converts a plain qkv.Transformer (train with --no-copy)")
    import transformers

    c = model.config
    model_type, fields = _marian_hf_config(c) if isinstance(model, Transformer) else _hf_config(c)
    family, (config_name, model_name) = FAMILIES[model_type], HF_TASK_MODELS[model_type]
    hf = getattr(transformers, model_name)(getattr(transformers, config_name)(**{**fields, **config_kwargs}))
    own, prefix = model.state_dict(), family.base + "."
    state = {_full(r.hf, prefix): r.to_hf(tuple(own[q] for q in r.qkv)).contiguous() for r in family.rules(c)}
    state |= {_full(k, prefix): state[_full(src, prefix)] for k, src in family.copies(c).items()}  # tied names
    state |= {k: v for k, v in hf.state_dict().items() if family.ignored.fullmatch(k)}  # tables HF computes itself
    hf.load_state_dict(state, strict=True)
    return hf.to(device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype).eval()


# --- how Hugging Face decodes a Marian checkpoint ---------------------------------------------------

UNSUPPORTED_SEARCH = dict(min_length=0, min_new_tokens=None, no_repeat_ngram_size=0, repetition_penalty=1.0,
                          num_beam_groups=1, do_sample=False)  # generate settings a Special cannot express


def _token_id(hf: dict, key: str, vocab: int, problems: list[str], *, optional: bool = False) -> int | None:
    value = hf.get(key)
    one = value[0] if isinstance(value, list) and len(value) == 1 else value
    if one is None and optional:
        return None
    if not isinstance(one, int) or isinstance(one, bool) or not 0 <= one < vocab:
        problems.append(f"{key}={value!r} (expected one token id in [0, {vocab}))")
        return None
    return one


def _suppressed(hf: dict, vocab: int, problems: list[str]) -> tuple[int, ...]:
    """Single-token bad_words_ids and suppress_tokens: the ids generate never emits."""
    bad, extra = hf.get("bad_words_ids") or [], hf.get("suppress_tokens") or []
    if not isinstance(bad, list) or not all(isinstance(w, list) and len(w) == 1 for w in bad):
        problems.append(f"bad_words_ids={bad!r:.80} (qkv suppresses single tokens: expected [[id], …])")
        bad = []
    ids = [w[0] for w in bad] + (extra if isinstance(extra, list) else [extra])
    wrong = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab]
    if wrong:
        problems.append(f"suppressed ids {wrong!r:.80} (expected token ids in [0, {vocab}))")
    return tuple(dict.fromkeys(i for i in ids if i not in wrong))


def _generation_settings(d: Path) -> dict:
    """config.json, overridden by generation_config.json where the directory has one."""
    path = d / "generation_config.json"
    return {**_read_config(d), **(_read_json_object(path) if path.is_file() else {})}


def marian_special(source: str | os.PathLike | dict) -> Special:
    """The tokens Hugging Face's ``generate`` decodes a Marian checkpoint with, as a ``Special``.

    start = decoder_start_token_id (Marian's pad), eos = eos_token_id, pad = pad_token_id,
    suppress = single-token bad_words_ids (Marian's pad) and suppress_tokens, force_eos_at_end =
    forced_eos_token_id is set, renormalize = renormalize_logits. ``source``: a checkpoint
    directory (generation_config.json over config.json) or those settings as one dict.
    Raises ValueError listing every missing id and every setting a Special cannot express.
    """
    hf = source if isinstance(source, dict) else _generation_settings(Path(source))
    hf, problems = {k: v for k, v in hf.items() if v is not None}, []  # None: unset (GenerationConfig.to_dict)
    _require(hf, problems, **UNSUPPORTED_SEARCH)
    vocab = hf.get("decoder_vocab_size") or hf.get("vocab_size", 58101)
    vocab = vocab if isinstance(vocab, int) else 0
    start, eos, pad = (_token_id(hf, k, vocab, problems) for k in ("decoder_start_token_id", "eos_token_id",
                                                                     "pad_token_id"))
    forced = _token_id(hf, "forced_eos_token_id", vocab, problems, optional=True)
    if forced is not None and eos is not None and forced != eos:
        problems.append(f"forced_eos_token_id={forced} differs from eos_token_id={eos} (qkv forces its EOS)")
    suppress = _suppressed(hf, vocab, problems)
    if problems:
        raise ValueError("cannot decode as Hugging Face's generate does: " + "; ".join(problems))
    return Special(start=start, eos=eos, pad=pad, suppress=suppress, force_eos_at_end=forced is not None,
                   renormalize=hf.get("renormalize_logits") is True)


# --- a checkpoint directory with its tokenizer ------------------------------------------------------

class Tokenizer:
    """A checkpoint's tokenizer behind the small interface qkv's commands use.

    Wraps a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. ``encode`` adds the
    special tokens the tokenizer is configured to add (LLaMA's <s>, BERT's [CLS] … [SEP]);
    ``decode`` keeps special tokens, so ids and text correspond one to one.

    An encoder-decoder's tokenizer carries ``special`` (a ``qkv.beam_search.Special``: where
    decoding starts, stops and pads). Then ``encode`` gives the text's ids alone and ``decode``
    drops special tokens: the search places start and EOS itself (``translate_texts``).
    """

    def __init__(self, backend, *, eos_id: int | None = None, special: Special | None = None) -> None:
        self.backend, self.special = backend, special
        self._hf = hasattr(backend, "convert_ids_to_tokens")  # transformers; else tokenizers
        own_eos = getattr(backend, "eos_token_id", None) if self._hf else None
        self.eos_id: int | None = own_eos if own_eos is not None else eos_id

    @property
    def vocab_size(self) -> int:
        """Every id encode can return, added tokens included."""
        return len(self.backend) if self._hf else self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=self.special is None)
        return list(ids) if self._hf else ids.ids

    def decode(self, ids) -> str:
        ids = self._check(ids)
        return self.backend.decode(ids, skip_special_tokens=self.special is not None)

    def token_strings(self, ids) -> list[str]:
        """One readable string per id (for plot labels): its decoded text, or the raw token when
        that is empty or a partial UTF-8 character."""
        out = []
        for i in self._check(ids):
            text = self.backend.decode([i], skip_special_tokens=False)
            if not text or "\ufffd" in text:
                raw = self.backend.convert_ids_to_tokens(i) if self._hf else self.backend.id_to_token(i)
                text = raw if raw is not None else text
            out.append(text)
        return out

    def _check(self, ids) -> list[int]:
        try:  # ints, numpy ints and integer tensors; never a float silently truncated
            ids = [operator.index(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
        except TypeError:
            raise TypeError(f"token ids must be a sequence of ints, got {ids!r:.80}") from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}")
        return ids

    def __repr__(self) -> str:
        return f"Tokenizer({type(self.backend).__name__}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def find_tokenizer(path: str | os.PathLike, *, special: Special | None = None) -> Tokenizer | None:
    """The tokenizer saved in a checkpoint directory (offline), or None when it has none.

    Read with ``transformers.AutoTokenizer`` (honouring tokenizer_config.json) when installed,
    else from tokenizer.json with ``tokenizers``. ``special``: an encoder-decoder's decoding tokens.
    """
    d = Path(path)
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        return None
    eos = _read_config(d).get("eos_token_id") if (d / "config.json").is_file() else None
    eos = eos[0] if isinstance(eos, list) and eos else eos
    eos = eos if isinstance(eos, int) else None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        if not (d / "tokenizer.json").is_file():
            raise ValueError(f"the tokenizer in {d} needs transformers: pip install 'qkv[hf]'") from None
        from tokenizers import Tokenizer as Fast

        return Tokenizer(Fast.from_file(str(d / "tokenizer.json")), eos_id=eos, special=special)
    try:
        backend = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except ImportError as e:  # MarianTokenizer needs sentencepiece
        raise ValueError(f"cannot load the tokenizer in {d}: {e}; pip install 'qkv[hf]'") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot load the tokenizer in {d}: {e}") from None
    return Tokenizer(backend, eos_id=eos, special=special)



def load_tokenizer(path: str | os.PathLike, *, special: Special | None = None) -> Tokenizer | None:
    """Deprecated name of ``find_tokenizer`` (None when the directory has no tokenizer), kept for one
    release: ``qkv.data.load_tokenizer`` is the loader that raises when a run has none."""
    import warnings

    warnings.warn("qkv.interop.hf.load_tokenizer is now find_tokenizer", DeprecationWarning, stacklevel=2)
    return find_tokenizer(path, special=special)

def load_pretrained(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32
                    ) -> tuple[GPT | Encoder | Transformer, Tokenizer | None]:
    """``from_hf(path)`` and the tokenizer saved beside it (None when the directory has none).

    For a Marian checkpoint the tokenizer carries ``special = marian_special(path)``.
    """
    model = from_hf(path, dtype=dtype)
    tokenizer = find_tokenizer(path, special=marian_special(path) if isinstance(model, Transformer) else None)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")
    return model, tokenizer
