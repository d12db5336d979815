"""`qkv export --format gguf` and ``qkv.interop.gguf.to_gguf``: the file read back with gguf-py's GGUFReader.

Every tensor name is the set llama.cpp expects for the architecture (derived from ``gguf.MODEL_TENSORS``), every
value equals the Hugging Face weight (q/k un-permuted by the converter's formula), metadata keys and values as
convert_hf_to_gguf.py writes them, and llama.cpp's graph (adjacent RoPE pairs for llama, halves for qwen2/qwen3)
over the file's tensors gives qkv's logits: both written out in tests/gguf_reference.py.
"""
import pytest
import torch

import qkv
from qkv.cli import main
from qkv.data import BPETokenizer, CharTokenizer
from qkv.training.export import hf_tokenizer
from qkv.training.run_dir import load_run, save_model

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")
pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from gguf_reference import Graph, check_metadata, check_values, expected_names, read  # noqa: E402

TEXT = "def f(x):\n    return x * 2  # é ✓ 中\n" * 20
LLAMA = dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False, num_kv_heads=2),
             position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
             normalization=dict(kind="rmsnorm"), head=dict(tie=False))
DENSE_LLAMA = ("ROPE_FREQS", "ATTN_ROT_EMBD", "FFN_GATE_INP.*", ".*_EXP")  # optional, or a mixture of experts'


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def make_run(path, tokenizer, **shape):
    torch.manual_seed(0)
    config = qkv.ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, attention=dict(num_heads=4), num_layers=2,
                             max_len=64).replace(**shape)
    save_model(path, perturbed(qkv.GPT(config)), tokenizer)
    return path


def check_vocabulary(meta, hf_tok, vocab_size):
    """tokenizer.ggml.*: byte-level BPE, one token per id (the tokenizer's, in id order), its merges."""
    import json

    assert meta[gguf.Keys.Tokenizer.MODEL] == "gpt2" and meta[gguf.Keys.Tokenizer.PRE] == "gpt-2"
    tokens = meta[gguf.Keys.Tokenizer.LIST]
    assert len(tokens) == vocab_size == len(meta[gguf.Keys.Tokenizer.TOKEN_TYPE])
    assert tokens == [hf_tok.convert_ids_to_tokens(i) for i in range(vocab_size)]
    merges = json.loads(hf_tok.backend_tokenizer.to_str())["model"]["merges"]
    assert meta[gguf.Keys.Tokenizer.MERGES] == [m if isinstance(m, str) else " ".join(m) for m in merges]


@pytest.mark.parametrize("dtype, qtype, file_type", [
    ("f32", "F32", "ALL_F32"), ("f16", "F16", "MOSTLY_F16"), ("q8_0", "Q8_0", "MOSTLY_Q8_0")])
def test_a_llama_run_as_gguf(tmp_path, capsys, dtype, qtype, file_type):
    run = make_run(tmp_path / "run", BPETokenizer.train(TEXT, 300), **LLAMA)
    out = tmp_path / "out" / "model.gguf"
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(out), "--gguf-type", dtype]) == 0
    assert f"wrote {out}: run it with llama-cli -m {out}" in capsys.readouterr().out
    values, types, meta = read(out)
    loaded = load_run(run)
    hf = qkv.interop.to_hf(loaded.model)
    config, arch = hf.config.to_dict() | {"rope_theta": 10000.0}, gguf.MODEL_ARCH.LLAMA
    assert set(values) == expected_names(arch, 2, absent=DENSE_LLAMA)
    check_values(values, types, hf.state_dict(), arch, config, getattr(gguf.GGMLQuantizationType, qtype))
    check_metadata(meta, arch, config, getattr(gguf.LlamaFileType, file_type))
    check_vocabulary(meta, hf_tokenizer(loaded.tokenizer), config["vocab_size"])
    ids = loaded.tokenizer.encode("def f(x):\n    return 2 * x")
    with torch.no_grad():
        want = loaded.model(torch.tensor([ids])).logits[0]
    share = {"f32": 1e-5, "f16": 1e-3, "q8_0": 0.1}[dtype]  # of the largest logit: rounding (the layout is f32's check)
    got = Graph(values, meta, arch).logits(ids)
    torch.testing.assert_close(got, want, atol=share * want.abs().max().item(), rtol=0)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no temporary file left


SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=64, rope_theta=50000.0, rms_norm_eps=1e-5)
HF_FAMILIES = [  # (config class, model class, settings, gguf arch, biases llama.cpp reads)
    ("LlamaConfig", "LlamaForCausalLM", {}, "LLAMA", ()),
    ("MistralConfig", "MistralForCausalLM", dict(sliding_window=64), "LLAMA", ()),
    ("Qwen2Config", "Qwen2ForCausalLM", {}, "QWEN2", ("ATTN_Q", "ATTN_K", "ATTN_V")),
    ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True), "QWEN3", ()),
]


def hf_checkpoint(path, config_class, model_class, settings):
    """A random HF checkpoint with a byte-level BPE tokenizer (bos, eos, a chat template), as save_pretrained writes."""
    import transformers

    tok = hf_tokenizer(BPETokenizer.train(TEXT, 300, special_tokens=("<|pad|>", "<|bos|>", "<|eos|>")))
    tok.bos_token, tok.eos_token, tok.chat_template = "<|bos|>", "<|eos|>", "{{ messages[0]['content'] }}"
    config = getattr(transformers, config_class)(vocab_size=len(tok) + 3, **SHAPE, **settings)  # 3 padded ids
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, model_class)(config)).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


@pytest.mark.parametrize("config_class, model_class, settings, arch, biases", HF_FAMILIES)
def test_a_hugging_face_checkpoint_loaded_by_qkv_as_gguf(tmp_path, config_class, model_class, settings, arch, biases):
    from qkv.interop.gguf import to_gguf
    from qkv.interop.hf import load_pretrained

    hf, hf_tok = hf_checkpoint(tmp_path / "hf", config_class, model_class, settings)
    model, tok = load_pretrained(tmp_path / "hf")
    out = to_gguf(model, tok.backend, tmp_path / "model.gguf", dtype="f32")
    values, types, meta = read(out)
    arch, config = getattr(gguf.MODEL_ARCH, arch), {**SHAPE, "vocab_size": hf.config.vocab_size}
    tied = settings.get("tie_word_embeddings", False)
    absent = DENSE_LLAMA + (("OUTPUT",) if tied else ())
    assert set(values) == expected_names(arch, 2, absent=absent, biases=biases)
    check_values(values, types, hf.state_dict(), arch, config, gguf.GGMLQuantizationType.F32)
    check_metadata(meta, arch, config, gguf.LlamaFileType.ALL_F32)
    tokens, loaded = meta[gguf.Keys.Tokenizer.LIST], tok.backend  # as qkv loaded it (Qwen2's adds <|endoftext|>)
    assert tokens == loaded.convert_ids_to_tokens(list(range(len(loaded)))) + \
        [f"[PAD{i}]" for i in range(len(loaded), hf.config.vocab_size)]
    assert [tokens[meta[k]] for k in (gguf.Keys.Tokenizer.BOS_ID, gguf.Keys.Tokenizer.EOS_ID)] == ["<|bos|>", "<|eos|>"]
    kinds = meta[gguf.Keys.Tokenizer.TOKEN_TYPE]
    assert {tokens[i] for i, t in enumerate(kinds) if t == gguf.TokenType.CONTROL} == \
        {"<|pad|>", "<|bos|>", "<|eos|>"} | set(loaded.all_special_tokens)  # added as special: control
    assert set(kinds[len(loaded):]) == {gguf.TokenType.UNUSED}
    assert meta[gguf.Keys.Tokenizer.CHAT_TEMPLATE] == hf_tok.chat_template
    assert meta[gguf.Keys.Tokenizer.ADD_BOS] is False and meta[gguf.Keys.Tokenizer.ADD_EOS] is False
    ids = hf_tok("def f(x):\n    return 2 * x").input_ids
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = Graph(values, meta, arch).logits(ids)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)


def test_a_character_vocabulary_as_byte_level_bpe(tmp_path):
    """Each character is one token spelled in GPT-2's byte alphabet; merges rebuild a multi-byte one from its bytes."""
    from qkv.interop.gguf import byte_level

    tok = CharTokenizer.train(TEXT)
    run = make_run(tmp_path / "run", tok, **LLAMA)
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(tmp_path / "c.gguf")]) == 0
    _, _, meta = read(tmp_path / "c.gguf")
    tokens, merges = meta[gguf.Keys.Tokenizer.LIST], meta[gguf.Keys.Tokenizer.MERGES]
    assert tokens == [byte_level(c) for c in tok.chars] and byte_level(" \n") == "ĠĊ"
    rank = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
    for c, token in zip(tok.chars, tokens):
        parts = list(token)  # BPE as llama.cpp runs it: merge the best-ranked pair until none is left
        while (pairs := [p for p in zip(parts, parts[1:]) if p in rank]):
            i = list(zip(parts, parts[1:])).index(min(pairs, key=rank.get))
            parts[i:i + 2] = ["".join(parts[i:i + 2])]
        assert parts == [token], c
    assert {len(c.encode()) for c in tok.chars} == {1, 2, 3} and len(merges) == 1 + 2 * 2  # é: 1; ✓, 中: 2 each


@pytest.mark.parametrize("shape, message", [
    (dict(position=dict(kind="learned"), feed_forward=dict(activation="gelu_tanh")), r"GPT-2 model: GPT-2 shape .*llama.cpp's gpt2"),
    (dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False), position=dict(kind="rope"),
          feed_forward=dict(bias=False)), r"GPT-NeoX model: GPT-NeoX shape .*demo preset"),
    (dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False), position=dict(kind="rope"),
          feed_forward=dict(activation="geglu", bias=False), normalization=dict(kind="rmsnorm")),
     r"LLaMA model: hidden_act='gelu\w*' \(llama.cpp's llama gates with silu: SwiGLU\)"),
    (dict(position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
          normalization=dict(kind="rmsnorm"),
          attention=dict(num_heads=4, sliding_window=8, q_bias=False, k_bias=False, v_bias=False, out_bias=False)),
     r"Mistral model: sliding_window=8 < context 64 \(llama.cpp's llama attends to every key\)"),
])
def test_shapes_llama_cpp_would_run_differently_are_refused_with_the_reason(tmp_path, capsys, shape, message):
    import re

    run = make_run(tmp_path / "run", CharTokenizer.train(TEXT), **shape)
    out = tmp_path / "new" / "model.gguf"
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"no GGUF counterpart for this " + message, err[0]), err
    assert not (tmp_path / "new").exists()


def test_an_existing_file_is_kept_unless_overwrite_and_a_failure_leaves_nothing(tmp_path, capsys, monkeypatch):
    run = make_run(tmp_path / "run", CharTokenizer.train(TEXT), **LLAMA)
    out = tmp_path / "out" / "model.gguf"
    out.parent.mkdir()
    out.write_text("keep")
    args = ["export", "--run", str(run), "--format", "gguf", "--out", str(out)]
    assert main(args) == 2 and "already exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "keep"
    assert main(args + ["--overwrite"]) == 0 and read(out)[2][gguf.Keys.General.ARCHITECTURE] == "llama"

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    fresh = tmp_path / "out" / "other.gguf"
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(fresh)]) == 2
    assert "disk is full" in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no half-written file, no temporary


@pytest.mark.parametrize("args, message", [
    (["--format", "gguf", "--hf", "x"], "with --format gguf give the file as --out FILE.gguf"),
    (["--out", "x", "--gguf-type", "q8_0"], "--gguf-type q8_0 applies to --format gguf"),
    (["--format", "gguf", "--out", "x", "--gguf-type", "q4_0"], "invalid choice: 'q4_0'"),
])
def test_flags_that_do_not_go_together(tmp_path, capsys, args, message):
    run = make_run(tmp_path / "run", CharTokenizer.train(TEXT), **LLAMA)
    assert main(["export", "--run", str(run), *args]) == 2
    assert message in capsys.readouterr().err


def test_an_encoder_decoder_is_refused(tmp_path, capsys):
    tok = CharTokenizer.train(TEXT)
    save_model(tmp_path / "mt", qkv.Transformer(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    assert main(["export", "--run", str(tmp_path / "mt"), "--format", "gguf", "--out", str(tmp_path / "m.gguf")]) == 2
    assert "holds a Transformer" in capsys.readouterr().err and not (tmp_path / "m.gguf").exists()


def test_which_tokenizers_are_written():
    """GPT-2's byte-level regex is "gpt-2"; a Split regex llama.cpp names by its own pre-tokenizer name (the table
    holds Llama 3's and Qwen2's); SentencePiece-style BPE (byte_fallback) and unknown regexes are refused."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    from qkv.interop.gguf import PRE_TOKENIZERS, vocabulary

    tok = hf_tokenizer(BPETokenizer.train(TEXT, 300))
    assert vocabulary(tok)[3] == "gpt-2"
    for regex, name in [*PRE_TOKENIZERS.items(), (r"\w+|\s+", None)]:
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(use_regex=False)])
        if name:
            assert vocabulary(tok)[3] == name
        else:
            with pytest.raises(ValueError, match=r"pre-tokenizer .* is not one llama.cpp names"):
                vocabulary(tok)
    from transformers import PreTrainedTokenizerFast

    spm = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE({"a": 0, "<0x61>": 1}, [], byte_fallback=True)))
    with pytest.raises(ValueError, match=r"BPE with byte_fallback \(SentencePiece style\)"):
        vocabulary(spm)


def test_an_approximation_llama_cpp_takes_is_one_warning_line(tmp_path, capsys, monkeypatch):
    """`qkv export --format gguf` says each of llama.cpp's approximations (gpt-oss's rounded YaRN ramp) in one
    ``qkv export: warning:`` line on stderr and still writes the file."""
    import warnings

    from qkv.interop.gguf import GGUFApproximation
    from qkv.training import export as export_module

    run, out = make_run(tmp_path / "run", BPETokenizer.train(TEXT, 300), **LLAMA), tmp_path / "model.gguf"

    def approximated(*args, **kwargs):
        warnings.warn("the ramp's ends rounded", GGUFApproximation)
        return out
    monkeypatch.setattr(export_module, "export_run_gguf", approximated)
    assert main(["export", "--run", str(run), "--format", "gguf", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "qkv export: warning: the ramp's ends rounded" in captured.err.splitlines()
    assert f"wrote {out}" in captured.out
