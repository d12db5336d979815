"""A checkpoint directory written by ``save_pretrained``: config.json, generation_config.json and the weights.

Weights are read with safetensors, never unpickled: a directory holding only pickle files
(pytorch_model.bin, …) is refused with a hint, before anything in it is opened.
"""
from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

PICKLES = (".bin", ".pt", ".pth", ".ckpt")


def read_json_object(path: Path) -> dict:
    """A JSON file holding one object; ValueError naming the file otherwise."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def read_config(d: Path) -> dict:
    """The directory's config.json."""
    if not d.is_dir():
        raise ValueError(f"{d} is not a directory (expected one written by save_pretrained)")
    path = d / "config.json"
    if not path.is_file():
        raise ValueError(f"{d} has no config.json (expected a directory written by save_pretrained)")
    return read_json_object(path)


def generation_settings(d: Path) -> dict:
    """config.json, overridden by generation_config.json where the directory has one."""
    path = d / "generation_config.json"
    return {**read_config(d), **(read_json_object(path) if path.is_file() else {})}


def safetensors_files(d: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names (each a file in ``d``)."""
    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").is_file():
        return [d / "model.safetensors"]
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"cannot read {index}: {e}") from None
        bad = [n for n in names if not isinstance(n, str) or Path(n).name != n or not (d / n).is_file()]
        if bad:
            raise ValueError(f"{index} names shards that are not files in {d}: {bad}")
        return [d / n for n in names]
    found = sorted(p.name for p in d.iterdir() if p.suffix in PICKLES)
    hint = f" (found {', '.join(found)}: pickle files, which qkv never unpickles)" if found else ""
    raise ValueError(f"{d} has no model.safetensors{hint}; save with save_pretrained(..., safe_serialization=True)")


def read_safetensors(d: Path) -> dict[str, Tensor]:
    """Every tensor of the directory's safetensors file or shards."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: dict[str, Tensor] = {}
    for f in safetensors_files(d):
        try:
            tensors.update(load_file(str(f)))
        except (OSError, SafetensorError) as e:
            raise ValueError(f"cannot read {f}: {e}") from None
    return tensors
