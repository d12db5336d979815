"""GGUF files, which llama.cpp and Ollama run: a qkv decoder written through ``to_hf`` and gguf-py.

The model is first what ``to_hf`` makes of it (Hugging Face names, config and tokenizer); from there on
this module does what llama.cpp's ``convert_hf_to_gguf.py`` does for the same architecture, with the
``gguf`` package's own tables and writer (no format code here):

    names      ``gguf.get_tensor_name_map(arch, blocks)``: HF ``model.layers.0.self_attn.q_proj.weight``
               -> ``blk.0.attn_q.weight``; a tied head writes no ``output.weight`` (llama.cpp reuses
               ``token_embd``)
    q and k    llama.cpp's ``llama`` architecture rotates adjacent pairs (interleaved RoPE) where HF
               LLaMA rotates halves: its q/k rows (weights and biases) are permuted per head, as the
               converter's ``LlamaModel.permute``; ``qwen2``/``qwen3`` rotate halves, as HF
    types      f32, f16, bf16 or q8_0 for matrices; 1-D tensors and norms stay f32; a matrix whose rows
               do not split into q8_0's blocks of 32 falls back to f16 (the converter's rule)
    metadata   ``{arch}.context_length``, ``embedding_length``, ``block_count``, ``feed_forward_length``,
               ``attention.head_count(_kv)``, ``attention.key_length``/``value_length``,
               ``attention.layer_norm_rms_epsilon``, ``rope.freq_base``, ``rope.dimension_count``,
               ``vocab_size``, ``general.file_type``
    tokenizer  byte-level BPE as ``tokenizer.ggml.model = "gpt2"`` (tokens, token types, merges); a
               character vocabulary as the same, with merges that build each multi-byte character from
               its bytes; bos/eos ids and the chat template where the tokenizer has them

What llama.cpp would compute differently (another activation, RoPE scaling it does not read, sliding
windows shorter than the context) is refused in one ValueError naming each reason, before anything is
written. The file is written under a temporary name and renamed: a failure leaves nothing behind.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..fileio import atomic_path
from .hf import hf_config, to_hf
from .hf.rules import half_split_to_interleaved

# HF model_type -> (gguf.MODEL_ARCH member, its q/k rows permuted to interleaved RoPE)
ARCHES = {"llama": ("LLAMA", True), "mistral": ("LLAMA", True), "qwen2": ("QWEN2", False),
          "qwen3": ("QWEN3", False)}
# Families to_hf writes that this exporter does not: why, for the error message
NOT_WRITTEN = {
    "gpt2": "GPT-2 shape (learned positions, LayerNorm): llama.cpp's gpt2 architecture is not written by qkv's "
            "GGUF export yet; export a RoPE + RMSNorm + SwiGLU model (LLaMA shape), or use --format hf",
    "gpt_neox": "GPT-NeoX shape (RoPE with LayerNorm, the demo preset's): llama.cpp's gptneox architecture is not "
                "written by qkv's GGUF export yet; train with --norm rmsnorm --activation swiglu for a LLaMA "
                "shape, or use --format hf",
    "gemma2": "Gemma 2 ((1 + w) norms, soft caps, sliding layers) is not written by qkv's GGUF export yet",
    "gemma3": "Gemma 3 ((1 + w) norms, sliding layers, a local RoPE base) is not written by qkv's GGUF export yet",
    "smollm3": "SmolLM3 (layers without RoPE: position.nope_layers) is not written by qkv's GGUF export yet",
    "olmo2": "OLMo 2 (norms after each sublayer: normalization.post_sublayer; QK-norm over the whole projection: "
             "attention.qk_norm_scope='projection') is not written by qkv's GGUF export yet",
    "phi3": "Phi-3 with RoPE on part of each head (position.rotary_dim) is not written by qkv's GGUF export yet",
    **{t: f"{name}'s mixture-of-experts feed-forward is not written by qkv's GGUF export yet; use --format hf"
       for t, name in (("mixtral", "Mixtral"), ("qwen2_moe", "Qwen2-MoE"), ("qwen3_moe", "Qwen3-MoE"))},
    "gpt_oss": "gpt-oss's attention sinks (attention.kind='sink') and mixture-of-experts feed-forward are not written "
               "by qkv's GGUF export yet; use --format hf",
}
TYPES = ("f32", "f16", "bf16", "q8_0")  # --gguf-type: the matrices' type


def gguf_module():
    """The ``gguf`` package (the gguf extra), with the install line when it is missing."""
    try:
        import gguf
    except ImportError:
        raise ValueError("GGUF export needs the gguf package: pip install 'qkv[gguf]'") from None
    return gguf


def file_types(gguf, dtype: str):
    """(general.file_type, the matrices' GGMLQuantizationType) for ``dtype`` (one of ``TYPES``)."""
    f, q = gguf.LlamaFileType, gguf.GGMLQuantizationType
    table = {"f32": (f.ALL_F32, q.F32), "f16": (f.MOSTLY_F16, q.F16), "bf16": (f.MOSTLY_BF16, q.BF16),
             "q8_0": (f.MOSTLY_Q8_0, q.Q8_0)}
    if dtype not in table:
        raise ValueError(f"GGUF type must be one of {', '.join(TYPES)}, got {dtype!r}")
    return table[dtype]


def gguf_problems(model_type: str, hf: dict) -> list[str]:
    """What llama.cpp's architecture for ``model_type`` would compute differently from this HF config."""
    if model_type not in ARCHES:
        return [NOT_WRITTEN.get(model_type, f"Hugging Face model_type {model_type!r} has no GGUF mapping here")]
    arch, problems = ARCHES[model_type][0].lower(), []  # gguf.MODEL_ARCH_NAMES spells them so
    if hf.get("hidden_act") != "silu":
        problems.append(f"hidden_act={hf.get('hidden_act')!r} (llama.cpp's {arch} gates with silu: SwiGLU)")
    scaling = hf.get("rope_scaling") or {}
    if scaling.get("rope_type", "default") not in ("default", "linear"):
        problems.append(f"RoPE scaling {scaling['rope_type']!r} (written here: none or linear)")
    window, context = hf.get("sliding_window"), hf.get("max_position_embeddings")
    if hf.get("use_sliding_window", model_type == "mistral") and window is not None and window < context:
        problems.append(f"sliding_window={window} < context {context} (llama.cpp's {arch} attends to every key)")
    if model_type == "qwen3" and hf.get("attention_bias"):
        problems.append("attention biases (llama.cpp's qwen3 has none)")
    return problems


def check_exportable(model) -> tuple[dict, str, bool]:
    """(the HF config fields ``to_hf`` writes, gguf.MODEL_ARCH member name, q/k permuted) for ``model``;
    one ValueError naming every reason it has no GGUF counterpart."""
    family, fields = hf_config(getattr(model, "config", None), type(model))
    problems = gguf_problems(family.model_type, fields)
    if problems:
        raise ValueError(f"no GGUF counterpart for this {family.name} model: " + "; ".join(problems))
    return fields, *ARCHES[family.model_type]


def gguf_tensors(gguf, state: dict, fields: dict, arch, permute: bool):
    """(GGUF name, float32 array) for every tensor of an HF ``state`` dict, named by gguf's table, q/k
    permuted to interleaved RoPE where ``permute``."""
    names = gguf.get_tensor_name_map(arch, fields["num_hidden_layers"])
    heads = {"q_proj": fields["num_attention_heads"], "k_proj": fields["num_key_value_heads"]}
    for key, tensor in state.items():
        if key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and fields["tie_word_embeddings"]):
            continue  # a table llama.cpp computes; the tied head is token_embd
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{key} has no name in gguf's {gguf.MODEL_ARCH_NAMES[arch]} table")
        proj = key.rsplit(".", 2)[-2]
        if permute and proj in heads:
            tensor = half_split_to_interleaved(tensor, heads[proj])  # (H·D, …): per head (2, D/2) -> (D/2, 2)
        yield name, tensor.detach().to(torch.float32).cpu().numpy()


def encode(gguf, name: str, data, qtype):
    """(bytes or array, its GGMLQuantizationType): 1-D tensors and norms f32, as llama.cpp reads them."""
    if data.ndim <= 1 or name.endswith("_norm.weight"):
        qtype = gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows not a multiple of the block: the converter's fallback
        qtype = gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(data, qtype), qtype


def write_hparams(gguf, writer, fields: dict, file_type) -> None:
    """The architecture's metadata from the HF config fields, as convert_hf_to_gguf.py's LlamaModel writes it."""
    writer.add_context_length(fields["max_position_embeddings"])
    writer.add_embedding_length(fields["hidden_size"])
    writer.add_block_count(fields["num_hidden_layers"])
    writer.add_feed_forward_length(fields["intermediate_size"])
    writer.add_head_count(fields["num_attention_heads"])
    writer.add_head_count_kv(fields["num_key_value_heads"])
    writer.add_key_length(fields["head_dim"])
    writer.add_value_length(fields["head_dim"])
    writer.add_rope_dimension_count(fields["head_dim"])
    writer.add_rope_freq_base(float(fields["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(fields["rms_norm_eps"]))
    writer.add_vocab_size(fields["vocab_size"])
    scaling = fields.get("rope_scaling") or {}
    if scaling.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    writer.add_file_type(file_type)


# --- the tokenizer: byte-level BPE as llama.cpp's "gpt2" tokenizer model --------------------------------------

# a Split pre-tokenizer's regex -> llama.cpp's tokenizer.ggml.pre (llama-vocab.cpp's pre-tokenizer types)
PRE_TOKENIZERS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",  # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
}


def byte_level(text: str) -> str:
    """``text``'s UTF-8 bytes as GPT-2's byte-level alphabet spells them (a space is "Ġ")."""
    from tokenizers import pre_tokenizers

    pieces = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    return "".join(piece for piece, _ in pieces)


def pre_tokenizer_name(spec: dict | None) -> str:
    """tokenizer.ggml.pre for a tokenizer.json pre_tokenizer: GPT-2's byte-level regex, or a known Split."""
    parts = (spec or {}).get("pretokenizers", [spec]) if (spec or {}).get("type") == "Sequence" else [spec]
    for part in parts:
        if part and part.get("type") == "ByteLevel" and part.get("use_regex", True):
            return "gpt-2"
        if part and part.get("type") == "Split" and part.get("pattern", {}).get("Regex") in PRE_TOKENIZERS:
            return PRE_TOKENIZERS[part["pattern"]["Regex"]]
    raise ValueError(f"the tokenizer's pre-tokenizer {json.dumps(spec)[:120]} is not one llama.cpp names "
                     "(written here: GPT-2's byte-level regex, Llama 3's, Qwen2's)")


def char_vocabulary(chars: list[str]) -> tuple[list[str], list[str]]:
    """A character vocabulary as byte-level BPE: each character's bytes as one token, and the merges that
    build each multi-byte character from its bytes, left to right (no merge crosses characters: UTF-8
    continuation bytes never start one)."""
    tokens, merges = [byte_level(c) for c in chars], {}
    for t in tokens:
        for k in range(1, len(t)):
            merges[f"{t[:k]} {t[k]}"] = None
    return tokens, list(merges)


def vocabulary(tokenizer) -> tuple[dict[int, str], set[str], list[str], str]:
    """(id -> token, the special tokens, merges, tokenizer.ggml.pre) of a ``PreTrainedTokenizerFast`` whose
    backend is byte-level BPE or qkv's character vocabulary (a WordLevel model of single characters)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model, kind = spec["model"], spec["model"]["type"]
    if kind == "WordLevel" and all(len(t) == 1 for t in model["vocab"]):  # qkv's character vocabulary
        chars = sorted(model["vocab"], key=model["vocab"].get)
        tokens, merges = char_vocabulary(chars)
        return dict(enumerate(tokens)), set(), merges, "gpt-2"
    if kind != "BPE" or model.get("byte_fallback"):
        what = f"{kind} with byte_fallback (SentencePiece style)" if model.get("byte_fallback") else kind
        raise ValueError(f"the tokenizer is a {what}; GGUF export writes byte-level BPE (tokenizer.ggml.model "
                         "'gpt2') and character vocabularies")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]  # "a b" or ["a", "b"]
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    return by_id, special, merges, pre_tokenizer_name(spec.get("pre_tokenizer"))


def write_vocabulary(gguf, writer, tokenizer, vocab_size: int) -> None:
    """tokenizer.ggml.*: ``vocab_size`` tokens (ids the tokenizer lacks are "[PAD{i}]", unused, as the converter
    writes them; added tokens control or user-defined), merges, bos/eos ids, the chat template."""
    by_id, special, merges, pre = vocabulary(tokenizer)
    added, T = set(tokenizer.get_added_vocab()), gguf.TokenType
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [T.UNUSED if i not in by_id else T.CONTROL if t in special else T.USER_DEFINED if t in added
             else T.NORMAL for i, t in enumerate(tokens)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    write_special_tokens(writer, tokenizer)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def write_special_tokens(writer, tokenizer) -> None:
    """bos/eos ids where the tokenizer has them, and whether encoding adds them (said outright: llama.cpp's
    defaults differ between tokenizer models). What encoding adds is read off the ids of the empty text."""
    added = tokenizer("").input_ids  # [bos] where a template prepends it, [… eos] where one appends it
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is not None:
        writer.add_bos_token_id(bos)
    if eos is not None:
        writer.add_eos_token_id(eos)
    writer.add_add_bos_token(bos is not None and added[:1] == [bos])
    writer.add_add_eos_token(eos is not None and added[-1:] == [eos])


def to_gguf(model, tokenizer, path: str | os.PathLike, *, dtype: str = "f16", overwrite: bool = False,
            name: str | None = None) -> Path:
    """Write ``model`` (a qkv GPT of a shape ``to_hf`` writes as LLaMA, Mistral, Qwen2 or Qwen3) and
    ``tokenizer`` (a ``transformers.PreTrainedTokenizerFast``: byte-level BPE or a character vocabulary;
    its chat template and bos/eos ids go along) to the GGUF file ``path``.

    ``dtype``: the matrices' type, one of ``TYPES``. ValueError, with nothing written, for a model or
    tokenizer llama.cpp cannot run as it is, or an existing ``path`` without ``overwrite``.
    """
    gguf = gguf_module()
    path = Path(path)
    if path.exists() and (path.is_dir() or not overwrite):
        raise ValueError(f"{path} already exists; pass --overwrite to replace it" if not path.is_dir()
                         else f"{path} is a directory; GGUF export writes one file (e.g. {path / 'model.gguf'})")
    file_type, qtype = file_types(gguf, dtype)
    fields, arch_name, permute = check_exportable(model)
    arch = getattr(gguf.MODEL_ARCH, arch_name)
    writer = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or path.stem)
    write_hparams(gguf, writer, fields, file_type)
    write_vocabulary(gguf, writer, tokenizer, fields["vocab_size"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for tensor_name, data in gguf_tensors(gguf, to_hf(model).state_dict(), fields, arch, permute):
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
