"""A GGUF file as a qkv model: the writer's steps run backwards, through gguf-py's reader and the same tables.

    arches     llama.cpp's ``llama`` (LLaMA, and Mistral written as it), ``qwen2`` and ``qwen3``, read as the HF
               family ``ARCHES`` writes as each (``READ``); another architecture is refused naming it
    config     the ``{arch}.*`` keys ``write_hparams`` writes, as the HF config fields they came from (``HPARAMS``);
               a tied head where the file has no ``output.weight``; q/k/v biases where it has ``attn_q.bias``
    names      the HF keys the family's rules expect, each named by ``gguf.get_tensor_name_map`` as the writer
               names it, and that table inverted: a tensor it does not name is refused
    q and k    llama's rows permuted back from interleaved RoPE to HF's halves (``interleaved_to_half_split``)
    types      every type ``gguf.quants.dequantize`` reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K …),
               dequantised to float32; ggml's shape (ne0, ne1) is numpy's (rows, columns) reversed
    tokenizer  transformers' own GGUF tokenizer conversion (``AutoTokenizer.from_pretrained(dir, gguf_file=…)``),
               with the file's chat template; bos/eos ids as the model's generation settings

From there the model is built as ``from_hf`` builds one (``hf.load.build``): every family rule is reused.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ...models import GPT
from ..hf import FAMILIES, Tokenizer, interleaved_to_half_split
from ..hf.load import attach_generation_config, build
from .architectures import ARCHES, head_dim
from .library import gguf_module

READ = ("llama", "qwen2", "qwen3")  # the HF model_types read back, by the llama.cpp architecture each is written as
BY_ARCH = {ARCHES[t].name: t for t in READ}

# {arch}.* key (gguf.Keys, with the arch) -> the HF config field write_hparams wrote it from; None: required
HPARAMS = (("context_length", "max_position_embeddings", None), ("embedding_length", "hidden_size", None),
           ("block_count", "num_hidden_layers", None), ("feed_forward_length", "intermediate_size", None),
           ("attention.head_count", "num_attention_heads", None),
           ("attention.head_count_kv", "num_key_value_heads", "num_attention_heads"),
           ("attention.key_length", "head_dim", "head_dim"),
           ("attention.layer_norm_rms_epsilon", "rms_norm_eps", None), ("rope.freq_base", "rope_theta", 10000.0),
           ("vocab_size", "vocab_size", "vocab_size"))


def gguf_reader(path: Path):
    """gguf-py's ``GGUFReader`` over ``path``; ValueError naming the file when it is missing, truncated or damaged."""
    gguf = gguf_module()
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        return gguf, gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError, TypeError) as e:  # numpy reads past the end, a bad enum value
        size = path.stat().st_size
        raise ValueError(f"{path}: not a readable GGUF file ({size:,} bytes; truncated or damaged?): {e}") from None


def field(reader, key: str, default=None):
    """The value of metadata ``key`` (a str, number or list), ``default`` where the file lacks it."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def model_type(gguf, reader, path: Path) -> str:
    """The HF model_type of the file's architecture; ValueError for one qkv does not read."""
    arch = field(reader, gguf.Keys.General.ARCHITECTURE)
    if arch not in BY_ARCH:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not read by qkv (it reads {', '.join(BY_ARCH)})")
    if field(reader, gguf.Keys.LLM.EXPERT_COUNT.format(arch=arch)):
        raise ValueError(f"{path}: a mixture of experts ({arch} with {arch}.expert_count) is not read by qkv")
    return BY_ARCH[arch]


def hf_settings(gguf, reader, path: Path) -> dict:
    """The HF config of the file's metadata (``HPARAMS``), with its tokens' bos/eos ids; ValueError naming what
    is missing or what llama.cpp would compute that HF's family does not (RoPE scaling other than linear, RoPE on
    part of each head)."""
    hf_type = model_type(gguf, reader, path)
    arch, names = ARCHES[hf_type].name, {t.name for t in reader.tensors}
    hf = {"model_type": hf_type, "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in names,
          "attention_bias": "blk.0.attn_q.bias" in names}
    for key, name, default in HPARAMS:
        value = field(reader, f"{arch}.{key}")
        if value is None and default is None:
            raise ValueError(f"{path}: the metadata has no {arch}.{key} (the model's {name})")
        hf[name] = value if value is not None else hf.get(default)
    hf["vocab_size"] = hf["vocab_size"] or len(field(reader, gguf.Keys.Tokenizer.LIST, []))
    hf["head_dim"] = hf["head_dim"] or head_dim(hf)
    hf |= rope_scaling(reader, arch, path, hf["head_dim"])
    for special in ("bos", "eos"):
        value = field(reader, f"tokenizer.ggml.{special}_token_id")
        if value is not None:
            hf[f"{special}_token_id"] = int(value)
    return hf


def rope_scaling(reader, arch: str, path: Path, head_width: int) -> dict:
    """{"rope_scaling": linear's factor} where the file scales RoPE linearly; ValueError for other scalings and
    for RoPE on part of each head."""
    dims = field(reader, f"{arch}.rope.dimension_count", head_width)
    if dims != head_width:
        raise ValueError(f"{path}: {arch}.rope.dimension_count={dims} rotates part of each head of width "
                         f"{head_width}; qkv reads {arch} files that rotate all of it")
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return {}
    if kind != "linear":
        raise ValueError(f"{path}: {arch}.rope.scaling.type={kind!r} is not read by qkv (linear is)")
    return {"rope_scaling": {"rope_type": "linear", "factor": float(field(reader, f"{arch}.rope.scaling.factor"))}}


def hf_names(gguf, hf: dict) -> dict[str, str]:
    """GGUF tensor name -> the HF key it was written from, for every key the family's rules expect: the writer's
    ``get_tensor_name_map`` inverted."""
    family = FAMILIES[hf["model_type"]]
    from ...models import ModelConfig

    config = ModelConfig.from_dict(family.config(hf, []))
    keys = [family.full_key(r.hf, family.base + ".") for r in family.rules(config)] + ["lm_head.weight"]
    member = getattr(gguf.MODEL_ARCH, ARCHES[hf["model_type"]].member)
    table = gguf.get_tensor_name_map(member, hf["num_hidden_layers"])
    names = {table.get_name(k, try_suffixes=(".weight", ".bias")): k for k in keys}
    return {name: k for name, k in names.items() if name is not None}


def dequantized(gguf, tensor, path: Path) -> torch.Tensor:
    """One tensor of the file as float32, in numpy's (rows, columns) order; ValueError for a type gguf-py does not
    dequantise."""
    try:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise ValueError(f"{path}: tensor {tensor.name} is of type {tensor.tensor_type.name}, which gguf cannot "
                         "dequantise") from None
    shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml (ne0 = columns, ne1 = rows) -> (rows, columns)
    data = np.ascontiguousarray(data, dtype=np.float32).reshape(shape)
    return torch.from_numpy(data if data.flags.writeable else data.copy())  # F32 is a view of the mapped file


def hf_state(gguf, reader, hf: dict, path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors under their HF names, q/k rows back in HF's half-split order where the architecture
    permuted them; ValueError naming the tensors the family has no place for."""
    names, arch = hf_names(gguf, hf), ARCHES[hf["model_type"]]
    heads = {"q_proj": hf["num_attention_heads"], "k_proj": hf["num_key_value_heads"]}
    unknown = [t.name for t in reader.tensors if t.name not in names]
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} tensors have no place in qkv's {hf['model_type']}: "
                         + ", ".join(unknown[:6]))
    state = {}
    for tensor in reader.tensors:
        key = names[tensor.name]
        data = dequantized(gguf, tensor, path)
        proj = key.rsplit(".", 2)[-2]
        if arch.permute and proj in heads:
            data = interleaved_to_half_split(data, heads[proj])  # (H·D, …): per head (D/2, 2) -> (2, D/2)
        state[key] = data
    return state


def read_gguf(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the HF config, the HF state dict in float32) of a GGUF file of an architecture in ``READ``: what
    ``to_gguf`` was given, read back. ValueError naming the file and what is wrong with it."""
    path = Path(path)
    gguf, reader = gguf_reader(path)
    hf = hf_settings(gguf, reader, path)
    return hf, hf_state(gguf, reader, hf, path)


def from_gguf(path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32) -> GPT:
    """A qkv GPT with the weights of a GGUF file (llama.cpp's llama, qwen2 or qwen3; every type gguf-py
    dequantises), its bos/eos ids as ``model.generation_config``.

    Args:
        path: the .gguf file.
        dtype: the model's dtype: a floating ``torch.dtype`` or "auto" | "float32" | "bfloat16" | "float16"
            (``qkv.runtime.resolve_dtype``: auto is bfloat16 where it is computed natively).
    Raises:
        ValueError naming the file and the problem: missing, truncated, another architecture, a tensor type
        gguf cannot dequantise, a tensor the family has no place for.
    """
    from ...runtime import resolve_dtype

    dtype = resolve_dtype(dtype)
    path = Path(path)
    gguf, reader = gguf_reader(path)
    hf = hf_settings(gguf, reader, path)
    model = build(hf, lambda: hf_state(gguf, reader, hf, path), str(path), dtype=dtype, dropout=0.0)
    return attach_generation_config(model, hf, str(path))


def gguf_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The file's tokenizer and chat template, converted by transformers (``AutoTokenizer`` with ``gguf_file``)."""
    path = Path(path)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("a GGUF file's tokenizer is read by transformers: pip install 'qkv[hf]'") from None
    try:
        backend = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, NotImplementedError) as e:
        raise ValueError(f"{path}: cannot read its tokenizer: {e}") from None
    return Tokenizer(backend)


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32) -> tuple[GPT, Tokenizer]:
    """``from_gguf(path)`` and the file's tokenizer (``gguf_tokenizer``)."""
    model = from_gguf(path, dtype=dtype)
    tokenizer = gguf_tokenizer(path)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")
    return model, tokenizer
