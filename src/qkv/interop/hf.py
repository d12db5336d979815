"""Hugging Face GPT-2, LLaMA and BERT checkpoints as qkv models, and qkv models as Hugging Face ones.

A checkpoint becomes two things in qkv's terms: a ``ModelConfig`` (what the HF config
means — widths, norm, activation, positional scheme) and a table of weight ``Rule``s,
each tying one HF tensor to one or more qkv tensors with the layout change between them.
Nothing model-specific runs inside qkv's attention:

    GPT-2  learned PE · pre-LN LayerNorm · gelu_tanh · biases · tied head; Conv1D stores W
           transposed and packs Q, K, V in one c_attn (Radford et al. 2019)
    LLaMA  RoPE half-split (rope_theta) · RMSNorm · SwiGLU · grouped K/V heads · no biases
           (Touvron et al. 2023)
    BERT   learned PE + token types + embedding LayerNorm · post-LN · gelu (Devlin et al. 2019)

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

from ..models import GPT, Encoder, ModelConfig

HEAD = "lm_head.weight"  # the one weight outside the base model (GPT2LMHeadModel, LlamaForCausalLM)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


@dataclass(frozen=True)
class Rule:
    """One HF tensor <-> one or more qkv tensors; ``to_hf`` is the exact inverse of ``to_qkv``."""

    hf: str  # relative to the base model ("h.0.ln_1.weight"), except HEAD
    qkv: tuple[str, ...]
    to_qkv: Callable[[Tensor], tuple[Tensor, ...]]
    to_hf: Callable[[tuple[Tensor, ...]], Tensor]


def _same(hf: str, qkv: str) -> Rule:
    return Rule(hf, (qkv,), lambda t: (t,), lambda ts: ts[0])


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


def _head(c: ModelConfig) -> list[Rule]:
    return [] if c.tie_embeddings else [_same(HEAD, HEAD)]


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
    rules = [_same("wte.weight", "embed.tok.weight"), _same("wpe.weight", "embed.pos.weight"),
             _same("ln_f.weight", "final_norm.weight"), _same("ln_f.bias", "final_norm.bias")]
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
    return rules + _head(c)


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
    rules = [_same("embed_tokens.weight", "embed.tok.weight"), _same("norm.weight", "final_norm.weight")]
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
    return rules + _head(c)


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


@dataclass(frozen=True)
class Family:
    """How one HF model_type maps onto qkv."""

    base: str  # the base model's attribute in the task models (GPT2LMHeadModel.transformer, …)
    model: type  # qkv.GPT or qkv.Encoder
    config: Callable[[dict, list[str]], dict]  # HF config -> ModelConfig fields, appending problems
    rules: Callable[[ModelConfig], list[Rule]]
    ignored: re.Pattern  # keys that are no weights of qkv's model: buffers, heads qkv does not model


FAMILIES = {
    "gpt2": Family("transformer", GPT, _gpt2_config, _gpt2_rules,
                   re.compile(r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias")),  # old causal-mask buffers
    "llama": Family("model", GPT, _llama_config, _llama_rules,
                    re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")),
    "bert": Family("bert", Encoder, _bert_config, _bert_rules,  # the pooler and MLM/NSP heads are not loaded
                   re.compile(r"(bert\.)?(embeddings\.position_ids|pooler\..+)|cls\..+")),
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


def _convert(tensors: dict[str, Tensor], family: Family, config: ModelConfig, own: dict[str, Tensor],
             problems: list[str]) -> dict[str, Tensor]:
    """HF tensors -> qkv state dict; every missing/unexpected key and shape mismatch goes to problems."""
    tensors = {_modern_name(k): t for k, t in tensors.items()}
    prefix = family.base + "." if any(k.startswith(family.base + ".") for k in tensors) else ""
    rules = {(r.hf if r.hf == HEAD else prefix + r.hf): r for r in family.rules(config)}
    tied_head = family.model is GPT and config.tie_embeddings
    missing = [k for k in rules if k not in tensors]
    unexpected = [k for k in tensors if k not in rules and not (tied_head and k == HEAD)
                  and not family.ignored.fullmatch(k)]
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
    if tied_head and HEAD in tensors and "embed.tok.weight" in out:
        if tensors[HEAD].shape != out["embed.tok.weight"].shape or not torch.equal(tensors[HEAD], out["embed.tok.weight"]):
            wrong.append(f"{HEAD} differs from the token embedding although tie_word_embeddings is true")
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", wrong)):
        if items:
            problems.append(_listing(label, items))
    if tied_head:
        out[HEAD] = out.get("embed.tok.weight")
    return out


def _build(hf_config: dict, load: Callable[[], dict[str, Tensor]], name: str, *,
           dtype: torch.dtype, dropout: float) -> GPT | Encoder:
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


def _read_config(d: Path) -> dict:
    if not d.is_dir():
        raise ValueError(f"{d} is not a directory (expected one written by save_pretrained)")
    path = d / "config.json"
    if not path.is_file():
        raise ValueError(f"{d} has no config.json (expected a directory written by save_pretrained)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def from_hf(source: str | os.PathLike | nn.Module, *, dtype: torch.dtype = torch.float32,
            dropout: float = 0.0) -> GPT | Encoder:
    """A qkv model with the weights of a Hugging Face GPT-2, LLaMA or BERT checkpoint.

    Args:
        source: a directory written by ``save_pretrained`` (config.json + model.safetensors,
            possibly sharded), or an in-memory ``transformers`` model.
        dtype: the returned model's dtype.
        dropout: qkv's one dropout rate (HF's several rates are training settings, not loaded).
    Returns:
        ``qkv.GPT`` (gpt2, llama) or ``qkv.Encoder`` (bert, without pooler or MLM head), in eval mode.
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


def to_hf(model: GPT, **config_kwargs) -> nn.Module:
    """A ``transformers`` GPT2LMHeadModel or LlamaForCausalLM holding exact copies of ``model``'s weights.

    learned PE + LayerNorm → GPT-2; RoPE + RMSNorm + swiglu/geglu → LLaMA (interleaved RoPE is
    stored half-split, q/k rows permuted). ``config_kwargs`` go to the HF config (e.g.
    ``eos_token_id=…``, ``attn_implementation="eager"``); special-token ids default to None.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"to_hf converts a qkv.GPT (to GPT-2 or LLaMA), got {type(model).__name__}")
    import transformers

    model_type, fields = _hf_config(model.config)
    family = FAMILIES[model_type]
    config_cls, model_cls = {"gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
                             "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[model_type]
    own = model.state_dict()
    state = {(r.hf if r.hf == HEAD else f"{family.base}.{r.hf}"): r.to_hf(tuple(own[q] for q in r.qkv)).contiguous()
             for r in family.rules(model.config)}
    if model.config.tie_embeddings:  # HF's state dict lists the tied head too
        state[HEAD] = own["embed.tok.weight"]
    hf = model_cls(config_cls(**{**fields, **config_kwargs}))
    hf.load_state_dict(state, strict=True)
    return hf.to(device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype).eval()


# --- a checkpoint directory with its tokenizer ------------------------------------------------------

class Tokenizer:
    """A checkpoint's tokenizer behind the small interface qkv's commands use.

    Wraps a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. ``encode`` adds the
    special tokens the tokenizer is configured to add (LLaMA's <s>, BERT's [CLS] … [SEP]);
    ``decode`` keeps special tokens, so ids and text correspond one to one.
    """

    def __init__(self, backend, *, eos_id: int | None = None) -> None:
        self.backend = backend
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
        return list(self.backend.encode(text)) if self._hf else self.backend.encode(text).ids

    def decode(self, ids) -> str:
        ids = self._check(ids)
        return self.backend.decode(ids, skip_special_tokens=False)

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


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer saved in a checkpoint directory (offline), or None when it has none.

    Read with ``transformers.AutoTokenizer`` (honouring tokenizer_config.json) when installed,
    else from tokenizer.json with ``tokenizers``.
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

        return Tokenizer(Fast.from_file(str(d / "tokenizer.json")), eos_id=eos)
    try:
        backend = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot load the tokenizer in {d}: {e}") from None
    return Tokenizer(backend, eos_id=eos)


def load_pretrained(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> tuple[GPT | Encoder, Tokenizer | None]:
    """``from_hf(path)`` and the tokenizer saved beside it (None when the directory has none)."""
    model = from_hf(path, dtype=dtype)
    tokenizer = load_tokenizer(path)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")
    return model, tokenizer
