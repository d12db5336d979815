"""The model's shape from the command line, nanoGPT-style: a few named flags and `--model KEY=VALUE`
for any ModelConfig field (a section's as ``attention.head_dim``, or a flat name such as ``d_ff``), applied
over the preset and validated as config.json is (``ModelConfig.from_dict``: unknown keys and wrong types
refused, then the config's own checks)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..models import ModelConfig
from ..models.config import FLAT, SECTIONS
from .errors import CommandError

MODEL_FLAGS = {  # flag -> (ModelConfig field, type, help); a new shape flag is one line here
    "--positional": ("positional", str, "positional encoding: sinusoidal, learned, rope, alibi or none"),
    "--d-model": ("d_model", int, "model width"),
    "--layers": ("num_layers", int, "number of Transformer blocks"),
    "--heads": ("num_heads", int, "attention heads (must divide --d-model)"),
    "--kv-heads": ("num_kv_heads", int, "key/value heads: grouped-query attention (must divide --heads)"),
}


def kinds(annotation) -> set[str]:
    """"int | None" -> {"int", "None"}; "tuple[str, ...] | None" -> {"tuple", "None"}."""
    return {t.strip().split("[")[0] for t in str(annotation).split("|")}


def field_types() -> dict[str, set[str]]:
    """Every key --model takes: the sizes, each section's fields as "section.field", and the flat names."""
    out = {}
    for f in fields(ModelConfig):
        if f.name in SECTIONS:
            out |= {f"{f.name}.{g.name}": kinds(g.type) for g in fields(SECTIONS[f.name])}
        else:
            out[f.name] = kinds(f.type)
    out |= {flat: out[f"{section}.{name}"] for flat, (section, name) in FLAT.items()}
    return out | {"bias": {"bool"}, "final_norm": {"bool", "None"}}


FIELD_TYPES = field_types()
NOT_A_FLAG = {"vocab_size": "the vocabulary size comes from the tokenizer (--vocab-size sets BPE's)"}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Declare the shape flags and the repeatable --model KEY=VALUE."""
    for flag, (_, typ, text) in MODEL_FLAGS.items():
        p.add_argument(flag, type=typ, default=None, help=f"{text} (default: the preset's)")
    p.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                   help="set any ModelConfig field over the preset, e.g. --model d_ff=512 --model norm=rmsnorm "
                        "(repeatable; true/false for booleans, none for optional fields)")


def parse_value(key: str, text: str) -> object:
    """``text`` read as ModelConfig field ``key``'s type: int, float, bool (true/false), str, or None."""
    if key not in FIELD_TYPES:
        raise CommandError(f"--model {key}=…: unknown ModelConfig field {key!r} (known: {', '.join(FIELD_TYPES)})")
    if key in NOT_A_FLAG:
        raise CommandError(f"--model {key}=…: {NOT_A_FLAG[key]}")
    types, low = FIELD_TYPES[key], text.strip().lower()
    if "None" in types and low in ("none", "null"):
        return None
    if "tuple" in types:
        return [t.strip() for t in text.split(",") if t.strip()]
    if "bool" in types:
        if low not in ("true", "false"):
            raise CommandError(f"--model {key}={text}: expected true or false")
        return low == "true"
    for name, cast in (("int", int), ("float", float)):
        if name in types:
            try:
                return cast(text)
            except ValueError:
                raise CommandError(f"--model {key}={text}: expected {'an' if name == 'int' else 'a'} {name}"
                                   + (" or none" if "None" in types else "")) from None
    return text


def model_overrides(args: argparse.Namespace) -> dict:
    """The ModelConfig fields the flags set; CommandError for a malformed pair or two flags that disagree."""
    given: dict = {}
    pairs = [(flag, field, getattr(args, flag[2:].replace("-", "_"))) for flag, (field, _, _) in MODEL_FLAGS.items()]
    for item in args.model:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--model expects KEY=VALUE, got {item!r}")
        pairs.append((f"--model {key.strip()}", key.strip(), parse_value(key.strip(), text)))
    for flag, field, value in pairs:
        if value is None and not flag.startswith("--model"):
            continue
        if field in given and given[field] != value:
            raise CommandError(f"{flag} and another flag for {field} disagree ({given[field]!r} vs {value!r})")
        given[field] = value
    return given


def apply_overrides(base: ModelConfig, overrides: dict) -> ModelConfig:
    """``base`` with ``overrides``, checked as config.json is (ValueError/TypeError in one line)."""
    d = base.to_dict()
    for key, value in overrides.items():
        section, dot, name = key.partition(".")
        if dot:
            d[section] = {**d[section], name: value}
        else:
            d[key] = value
    return ModelConfig.from_dict(d)
