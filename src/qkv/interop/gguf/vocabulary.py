"""llama.cpp's tokenizer metadata (``tokenizer.ggml.*``) for a ``transformers`` tokenizer: byte-level BPE as
llama.cpp's "gpt2" tokenizer model (tokens, token types, merges, the pre-tokenizer's name), a character vocabulary
as the same, bos/eos ids and the chat template."""
from __future__ import annotations

import json

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
