"""GGUF files, which llama.cpp and Ollama run: a qkv decoder written through ``to_hf`` and gguf-py, and read
back (``reader``: ``from_gguf``, ``load_gguf``; llama, qwen2 and qwen3 files, quantised or not).

The model is first what ``to_hf`` makes of it (Hugging Face names, config and tokenizer); from there on
this package does what llama.cpp's ``convert_hf_to_gguf.py`` does for the same architecture, with the
``gguf`` package's own tables and writer (no format code here):

    arches     LLaMA, Mistral and Mixtral as llama.cpp's ``llama``; Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
               OLMo 2, Phi-3, SmolLM3, gpt-oss and DeepSeek-V2/V3 as its ``qwen2``, ``qwen3``, ``qwen2moe``,
               ``qwen3moe``, ``olmo2``, ``phi3``, ``smollm3``, ``gpt-oss``, ``deepseek2``
               (``architectures``: the table, and the layout each reads)
    names      ``gguf.get_tensor_name_map(arch, blocks)``: HF ``model.layers.0.self_attn.q_proj.weight``
               -> ``blk.0.attn_q.weight``; a tied head writes no ``output.weight`` (llama.cpp reuses
               ``token_embd``) except where the architecture loads one
    q and k    llama.cpp's ``llama`` architecture rotates adjacent pairs (interleaved RoPE) where HF
               LLaMA rotates halves: its q/k rows (weights and biases) are permuted per head, as the
               converter's ``LlamaModel.permute``; the others rotate halves, as HF
    MLA        DeepSeek-V2/V3 as ``deepseek2`` (``deepseek``): kv_b_proj split per head into attn_k_b, attn_v_b
    experts    ``ffn_gate_inp`` (the router), ``ffn_{gate,up,down}_exps`` (E, ·, ·) stacked, Qwen2-MoE's
               shared expert ``ffn_*_shexp`` and its gate ``ffn_gate_inp_shexp``; gpt-oss's biases (``.bias``)
    types      f32, f16, bf16 or q8_0 for matrices; 1-D tensors, norms, routers and biases stay f32; a matrix whose
               rows do not split into q8_0's blocks of 32 falls back to f16 (the converter's rule)
    metadata   ``{arch}.context_length``, ``embedding_length``, ``block_count``, ``feed_forward_length``,
               ``attention.head_count(_kv)``, ``attention.key_length``/``value_length``,
               ``attention.layer_norm_rms_epsilon``, ``rope.freq_base``, ``rope.dimension_count``,
               ``vocab_size``, ``general.file_type``; with experts ``expert_count``, ``expert_used_count``,
               ``expert_feed_forward_length``, ``expert_shared_feed_forward_length``; gpt-oss's
               ``attention.sliding_window``; ``rope.scaling.*`` (linear, YaRN with deepseek2's
               ``yarn_log_multiplier``, Phi-3's LongRoPE: ``yarn`` for YaRN as llama.cpp runs it)
    tokenizer  (``vocabulary``) byte-level BPE as ``tokenizer.ggml.model = "gpt2"`` (tokens, token types,
               merges); a character vocabulary as the same, with merges that build each multi-byte
               character from its bytes; bos/eos ids and the chat template where the tokenizer has them

What llama.cpp would compute differently (another activation, RoPE scaling it does not read, sliding
windows shorter than the context, routing its architecture fixes otherwise) is refused in one ValueError
naming each reason, before anything is written. What llama.cpp runs with an approximation it takes itself for
that architecture (gpt-oss's released YaRN, truncate=False, with the ramp's ends rounded) is written with a
``GGUFApproximation`` warning saying what changes. The file is written under a temporary name and renamed: a
failure leaves nothing behind.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from ...fileio import atomic_path
from ..hf import to_hf
from .architectures import (ARCHES, NOT_WRITTEN, Arch, check_exportable, encode, gguf_problems, gguf_tensors,
                            gguf_warnings, write_hparams)
from .library import gguf_module
from .reader import READ, from_gguf, gguf_tokenizer, load_gguf, read_gguf
from .vocabulary import PRE_TOKENIZERS, byte_level, char_vocabulary, vocabulary, write_vocabulary

__all__ = ["to_gguf", "from_gguf", "load_gguf", "read_gguf", "gguf_tokenizer", "READ", "check_exportable",
           "gguf_problems", "gguf_warnings", "GGUFApproximation", "ARCHES",
           "NOT_WRITTEN", "Arch", "TYPES", "PRE_TOKENIZERS", "byte_level", "char_vocabulary", "vocabulary"]

TYPES = ("f32", "f16", "bf16", "q8_0")  # --gguf-type: the matrices' type


class GGUFApproximation(UserWarning):
    """The file runs in llama.cpp with an approximation llama.cpp takes itself; the message says what changes."""


def file_types(gguf, dtype: str):
    """(general.file_type, the matrices' GGMLQuantizationType) for ``dtype`` (one of ``TYPES``)."""
    f, q = gguf.LlamaFileType, gguf.GGMLQuantizationType
    table = {"f32": (f.ALL_F32, q.F32), "f16": (f.MOSTLY_F16, q.F16), "bf16": (f.MOSTLY_BF16, q.BF16),
             "q8_0": (f.MOSTLY_Q8_0, q.Q8_0)}
    if dtype not in table:
        raise ValueError(f"GGUF type must be one of {', '.join(TYPES)}, got {dtype!r}")
    return table[dtype]


def to_gguf(model, tokenizer, path: str | os.PathLike, *, dtype: str = "f16", overwrite: bool = False,
            name: str | None = None) -> Path:
    """Write ``model`` (a qkv GPT of a shape ``to_hf`` writes as one of the families in ``ARCHES``) and
    ``tokenizer`` (a ``transformers.PreTrainedTokenizerFast``: byte-level BPE or a character vocabulary;
    its chat template and bos/eos ids go along) to the GGUF file ``path``.

    ``dtype``: the matrices' type, one of ``TYPES``. ValueError, with nothing written, for a model or
    tokenizer llama.cpp cannot run as it is, or an existing ``path`` without ``overwrite``; a
    ``GGUFApproximation`` warning for what llama.cpp runs approximately (``gguf_warnings``).
    """
    gguf = gguf_module()
    path = Path(path)
    if path.exists() and (path.is_dir() or not overwrite):
        raise ValueError(f"{path} already exists; pass --overwrite to replace it" if not path.is_dir()
                         else f"{path} is a directory; GGUF export writes one file (e.g. {path / 'model.gguf'})")
    file_type, qtype = file_types(gguf, dtype)
    fields, arch = check_exportable(model)
    for message in gguf_warnings(arch, fields):
        warnings.warn(message, GGUFApproximation, stacklevel=2)
    writer = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch.member)])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or path.stem)
    write_hparams(gguf, writer, fields, arch, file_type)
    write_vocabulary(gguf, writer, tokenizer, fields["vocab_size"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for tensor_name, data in gguf_tensors(gguf, to_hf(model).state_dict(), fields, arch):
        data, raw = encode(gguf, tensor_name, data, qtype)
        writer.add_tensor(tensor_name, data, raw_dtype=raw)
    write_file(writer, path)
    return path


def write_file(writer, path: Path) -> None:
    """The writer's header, metadata and tensors under a temporary name beside ``path``, then renamed to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        try:
            writer.write_header_to_file(path=tmp)
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
