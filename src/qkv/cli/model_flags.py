"""The model's shape from the command line, nanoGPT-style: a few named flags and `--model KEY=VALUE`
for any ModelConfig field (a size as ``d_model``, a section's field as ``attention.head_dim``), applied over the
preset and validated as config.json is (``ModelConfig.from_dict``: unknown keys and wrong types refused, then the
config's own checks). A named flag is declared once, on the field it sets (``metadata={"flag": …, "help": …}``,
as ``AttentionConfig.num_heads``'s ``--heads``): ``model_flags`` finds them.

Multi-head latent attention is ``--model attention=mla`` (short for ``attention.kind=mla``); its widths
(``attention.kv_lora_rank`` …) default to DeepSeek-V2's proportions of the head width (``latent_defaults``)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..models import ModelConfig
from ..models.attention_config import LATENT_FIELDS
from ..models.config import FLAT, FLAT_APART, SECTIONS, section_fields
from .errors import CommandError


def kinds(annotation) -> set[str]:
    """"int | None" -> {"int", "None"}; "tuple[str, ...] | None" -> {"tuple", "None"}."""
    return {t.strip().split("[")[0] for t in str(annotation).split("|")}


def model_fields() -> dict:
    """Every key --model takes, with its dataclass field: the sizes ("d_model") and each section's fields
    ("attention.num_heads")."""
    out = {}
    for f in fields(ModelConfig):
        if f.name in SECTIONS:
            out |= {f"{f.name}.{g.name}": g for g in section_fields(f.name)}
        else:
            out[f.name] = f
    return out


FIELDS = model_fields()
FIELD_TYPES = {key: kinds(f.type) for key, f in FIELDS.items()}  # key -> {"int", "None"}, …
CASTS = {"int": int, "float": float, "str": str}


def model_flags() -> dict[str, tuple[str, type, str]]:
    """flag -> (the --model key it sets, its type, its help), for each field that declares one
    (``metadata={"flag": "--heads", "help": …}``)."""
    flags = {}
    for key, f in FIELDS.items():
        if "flag" in f.metadata:
            cast = next(CASTS[k] for k in sorted(FIELD_TYPES[key]) if k in CASTS)
            flags[f.metadata["flag"]] = (key, cast, f.metadata["help"])
    return flags


MODEL_FLAGS = model_flags()
ALIASES = {"attention": "attention.kind"}  # --model attention=mla
NOT_A_FLAG = {"vocab_size": "the vocabulary size comes from the tokenizer (--vocab-size sets BPE's)"}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Declare the shape flags and the repeatable --model KEY=VALUE."""
    for flag, (_, typ, text) in MODEL_FLAGS.items():
        p.add_argument(flag, type=typ, default=None, help=f"{text} (default: the preset's)")
    p.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                   help="set any ModelConfig field over the preset, a section's as SECTION.FIELD, e.g. --model "
                        "feed_forward.d_ff=512 --model normalization.kind=rmsnorm; "
                        "--model attention=mla: multi-head latent attention (with --positional rope), its "
                        "attention.kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim derived from the "
                        "head width unless given; a mixture of experts: --model moe.enabled=true --model "
                        "moe.num_experts=8 (moe.top_k, moe.d_expert, ...), trained with moe.aux_loss_coef (Switch's "
                        "load-balancing loss), moe.z_loss_coef (ST-MoE's router z-loss) and/or "
                        "moe.bias_update_speed (DeepSeek-V3's aux-loss-free balancing, its gamma) "
                        "(repeatable; true/false for booleans, none for optional fields)")


def parse_value(key: str, text: str) -> object:
    """``text`` read as ModelConfig field ``key``'s type: int, float, bool (true/false), str, or None."""
    if key == "moe.enabled":
        return parse_bool(key, text)
    if key in FLAT or key in FLAT_APART:
        raise CommandError(flat_key(key, text))
    if key not in FIELD_TYPES:
        known = ", ".join([*FIELD_TYPES, *ALIASES])
        raise CommandError(f"--model {key}=…: unknown ModelConfig field {key!r} (known: {known})")
    if key in NOT_A_FLAG:
        raise CommandError(f"--model {key}=…: {NOT_A_FLAG[key]}")
    types, low = FIELD_TYPES[key], text.strip().lower()
    if "None" in types and low in ("none", "null"):
        return None
    if "tuple" in types:
        return [t.strip() for t in text.split(",") if t.strip()]
    if "bool" in types:
        return parse_bool(key, text)
    for name, cast in (("int", int), ("float", float)):
        if name in types:
            try:
                return cast(text)
            except ValueError:
                raise CommandError(f"--model {key}={text}: expected {'an' if name == 'int' else 'a'} {name}"
                                   + (" or none" if "None" in types else "")) from None
    return text


def flat_key(key: str, text: str) -> str:
    """What --model says of a flat name (a config.json's, ``qkv.models.config.FLAT``): the field to set."""
    if key == "bias":
        return (f"--model bias={text}: the biases are {FLAT_APART['bias']}: set each, e.g. --model "
                f"attention.q_bias={text} --model feed_forward.bias={text}")
    field = FLAT_APART.get(key) or ".".join(FLAT[key])
    return f"--model {key}={text}: {key} is {field}: pass --model {field}={text}"


def model_overrides(args: argparse.Namespace) -> dict:
    """The ModelConfig fields the flags set; CommandError for a malformed pair or two flags that disagree."""
    given: dict = {}
    pairs = [(flag, field, getattr(args, flag[2:].replace("-", "_"))) for flag, (field, _, _) in MODEL_FLAGS.items()]
    for item in args.model:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--model expects KEY=VALUE, got {item!r}")
        key = ALIASES.get(key.strip(), key.strip())
        if key == "moe.enabled":
            continue  # a switch, not a field: settled below from moe.num_experts
        pairs.append((f"--model {key}", key, parse_value(key, text)))
    for flag, field, value in pairs:
        if value is None and not flag.startswith("--model"):
            continue
        if field in given and given[field] != value:
            raise CommandError(f"{flag} and another flag for {field} disagree ({given[field]!r} vs {value!r})")
        given[field] = value
    return given | moe_switch(args.model, given)


def moe_switch(items: list[str], given: dict) -> dict:
    """``--model moe.enabled=true`` needs ``moe.num_experts`` beside it (nothing to add); ``false`` turns the experts
    off (moe.num_experts none) and takes no other moe field."""
    values = [parse_bool("moe.enabled", t) for k, _, t in (i.partition("=") for i in items) if k.strip() == "moe.enabled"]
    if not values:
        return {}
    others = sorted(k for k in given if k.startswith("moe."))
    if len(set(values)) > 1:
        raise CommandError("--model moe.enabled is given both true and false")
    if values[0] and given.get("moe.num_experts") is None:
        raise CommandError("--model moe.enabled=true needs --model moe.num_experts=E (how many experts)")
    if not values[0] and others:
        raise CommandError(f"--model moe.enabled=false takes no other moe field, got {others}")
    return {} if values[0] else {"moe.num_experts": None}


def parse_bool(key: str, text: str) -> bool:
    low = text.strip().lower()
    if low not in ("true", "false"):
        raise CommandError(f"--model {key}={text}: expected true or false")
    return low == "true"


def apply_overrides(base: ModelConfig, overrides: dict) -> ModelConfig:
    """``base`` with ``overrides``, checked as config.json is (ValueError/TypeError in one line)."""
    d = base.to_dict()
    for key, value in overrides.items():
        section, dot, name = key.partition(".")
        if dot:
            d[section] = {**d.get(section, {}), name: value}  # moe: absent from to_dict while off
        else:
            d[key] = value
    d["attention"] = settled_attention(d, overrides)
    return ModelConfig.from_dict(d)


def settled_attention(d: dict, overrides: dict) -> dict:
    """The attention section of config dict ``d`` with MLA's widths that ``overrides`` leaves unset: derived
    (``latent_defaults``) when the kind is mla, dropped when a base's kind mla was changed to another."""
    a = dict(d["attention"])
    unset = [k for k in (*LATENT_FIELDS, "latent_cache") if f"attention.{k}" not in overrides]
    if a.get("kind") != "mla":
        return {k: v for k, v in a.items() if k not in unset}
    heads = a.get("num_heads")
    derived = latent_defaults(d["d_model"], heads) if isinstance(heads, int) and heads > 0 else {}
    return a | {k: v for k, v in derived.items() if k in unset and a.get(k) is None}


def latent_defaults(d_model: int, num_heads: int) -> dict:
    """MLA's widths from the head width d_h = d_model / H as DeepSeek-V2 sizes them (arXiv 2405.04434 §3.1.2:
    d_c = 4·d_h, d_R = d_h / 2; per head d_N = d_V = d_h), d_c at most d_model, d_R even and at least 2;
    no low-rank query path (q_lora_rank None: one q_proj, as DeepSeek-V2-Lite)."""
    d_h = max(1, d_model // num_heads)
    return dict(kv_lora_rank=min(4 * d_h, d_model), qk_rope_head_dim=max(2, d_h // 2 // 2 * 2),
                qk_nope_head_dim=d_h, v_head_dim=d_h, q_lora_rank=None)
