"""qkv.interop.hf: Hugging Face GPT-2, LLaMA and BERT checkpoints give identical numbers in qkv.

No network: each HF model is random-initialised from a tiny config (weights, norms and
biases all randomised so that a swapped tensor cannot go unnoticed), saved with
save_pretrained, and loaded back with qkv.
"""
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

import qkv
from qkv.interop import from_hf, to_hf
from qkv.interop.hf import Tokenizer, find_tokenizer, interleaved_to_half_split, load_pretrained

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from transformers import (  # noqa: E402
    BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
)

NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
HF_MODELS = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, **NO_SPECIAL)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **NO_SPECIAL)),
    "bert": lambda: BertModel(BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, type_vocab_size=3)),
}
HF_CLASSES = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM, "bert": BertModel}
DECODERS = ("gpt2", "llama")


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Norm weights ~ 1 ± 0.2, everything else ~ N(0, 0.2²): no parameter is left at a neutral value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if p.dim() == 1 and name.endswith("weight") else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{kind: directory} of tiny random HF models written by save_pretrained."""
    dirs = {}
    for i, (kind, build) in enumerate(HF_MODELS.items()):
        torch.manual_seed(i)
        dirs[kind] = tmp_path_factory.mktemp(kind)
        randomize(build(), seed=i).save_pretrained(dirs[kind])
    return dirs


def hf_eager(directory, kind):
    return HF_CLASSES[kind].from_pretrained(directory, attn_implementation="eager").eval()


def batch(kind: str, padding: str | None, T: int = 12):
    """ids (3, T) and the bool mask of real tokens (None without padding)."""
    ids = torch.randint(0, 96, (3, T), generator=torch.Generator().manual_seed(1))
    if padding is None:
        return ids, None
    lengths = torch.tensor([T, 9, 5])[:, None]
    pos = torch.arange(T)
    return ids, (pos < lengths if padding == "right" else pos >= T - lengths)


def hf_inputs(kind, ids, valid):
    """What HF needs to see what qkv sees: its mask and, for decoders, the positions HF's generate would use."""
    if valid is None:
        return {}
    extra = {"attention_mask": valid.long()}
    if kind in DECODERS:
        extra["position_ids"] = (valid.long().cumsum(-1) - 1).clamp(min=0)
    return extra


@pytest.mark.parametrize("padding", [None, "right", "left"])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_outputs_match_hf(saved, kind, padding):
    model, hf = from_hf(saved[kind]), HF_CLASSES[kind].from_pretrained(saved[kind]).eval()
    ids, valid = batch(kind, padding)
    with torch.no_grad():
        if kind == "bert":
            types = torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(2))
            ours = model(ids, mask=valid, token_type_ids=types).last_hidden_state
            theirs = hf(ids, token_type_ids=types, **hf_inputs(kind, ids, valid)).last_hidden_state
        else:
            ours, theirs = model(ids, mask=valid).logits, hf(ids, **hf_inputs(kind, ids, valid)).logits
    real = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
    assert ours.shape == theirs.shape
    assert theirs[real].abs().max() > 1.0  # the comparison is not between near-zero outputs
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_per_head_attention_weights_match_hf_eager(saved, kind):
    model, hf = from_hf(saved[kind]), hf_eager(saved[kind], kind)
    ids, valid = batch(kind, "left")
    with torch.no_grad():
        ours = model(ids, mask=valid, return_attention=True).attentions
        theirs = hf(ids, output_attentions=True, **hf_inputs(kind, ids, valid)).attentions
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape == (3, 4, 12, 12)  # (B, H, T, S)
        for row in range(3):  # real queries only; a padded query's row is arbitrary in HF
            torch.testing.assert_close(a[row][:, valid[row]], b[row][:, valid[row]], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", DECODERS)
def test_greedy_generation_with_kv_cache_matches_hf(saved, kind):
    model, hf = from_hf(saved[kind]), HF_CLASSES[kind].from_pretrained(saved[kind]).eval()
    prompt = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(3))
    ours = model.generate(prompt, 20, temperature=0)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                         pad_token_id=0)
    assert ours.shape == (1, 27)
    assert ours.tolist() == theirs.tolist()
    assert len(set(ours[0, 7:].tolist())) > 1  # not a degenerate repeat of one token


@pytest.mark.parametrize("kind", DECODERS)
def test_batched_left_padded_generation_matches_hf(saved, kind):
    model, hf = from_hf(saved[kind]), HF_CLASSES[kind].from_pretrained(saved[kind]).eval()
    ids, valid = batch(kind, "left", T=8)
    ours = model.generate(ids, 20, temperature=0, mask=valid)
    theirs = hf.generate(ids, attention_mask=valid.long(), max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert ours.tolist() == theirs.tolist()


def test_llama_grouped_query_attention_is_kept(saved):
    model = from_hf(saved["llama"])
    c = model.config
    assert (c.attention.num_heads, c.attention.num_kv_heads, c.position.kind, c.normalization.kind,
            c.feed_forward.activation, c.attention.biases, c.feed_forward.bias, c.head.tie) == (
        4, 2, "rope", "rmsnorm", "swiglu", (False,) * 4, False, False)
    assert c.position.base == 500.0 and c.normalization.eps == 1e-5
    assert model.blocks[0].attn.k_proj.weight.shape == (2 * 8, 32)  # (G·D, C)
    assert model.new_kv_caches(1, 4)[0].k.shape == (1, 2, 4, 8)  # the cache holds G heads, not H


def test_bert_maps_to_a_post_ln_encoder(saved):
    model = from_hf(saved["bert"])
    c = model.config
    assert isinstance(model, qkv.Encoder)
    assert (c.normalization.first, c.embedding.norm, c.embedding.type_vocab_size, c.normalization.eps, c.feed_forward.activation) == (
        False, True, 3, 1e-12, "gelu")
    assert model.final_norm is None


def meta_permute(w, n_heads, dim1, dim2):
    """Verbatim from Meta's convert_llama_weights_to_hf.py: interleaved RoPE rows -> half-split."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def test_rope_interleaved_equals_half_split_after_meta_permutation():
    cfg = qkv.ModelConfig(vocab_size=50, d_model=32,
                          attention=dict(num_heads=4, num_kv_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                          position=dict(kind="rope", interleaved=True),
                          feed_forward=dict(activation="swiglu", bias=False), normalization=dict(kind="rmsnorm"),
                          head=dict(tie=False), num_layers=2, max_len=32)
    interleaved = randomize(qkv.GPT(cfg))
    half = qkv.GPT(cfg.replace(position={"interleaved": False})).eval()
    state = interleaved.state_dict()
    half.load_state_dict(state)  # same weights, q/k rows not yet permuted
    ids = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        want = interleaved(ids, return_attention=True)
        assert not torch.allclose(half(ids, return_attention=True).attentions[0], want.attentions[0])
        for i in range(cfg.num_layers):
            for name, heads in (("q_proj", 4), ("k_proj", 2)):
                key = f"blocks.{i}.attn.{name}.weight"
                state[key] = meta_permute(state[key], heads, *state[key].shape)
                assert torch.equal(state[key], interleaved_to_half_split(interleaved.state_dict()[key], heads))
        half.load_state_dict(state)
        got = half(ids, return_attention=True)
    for a, b in zip(got.attentions, want.attentions):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    # to_hf applies the same permutation: HF's half-split LLaMA reproduces the interleaved model.
    with torch.no_grad():
        torch.testing.assert_close(to_hf(interleaved)(ids).logits, want.logits, atol=1e-4, rtol=1e-4)


QKV_SHAPES = {
    "gpt2": dict(attention=dict(q_bias=True, k_bias=True, v_bias=True, out_bias=True), position=dict(kind="learned"),
                 feed_forward=dict(activation="gelu_tanh", bias=True), normalization=dict(kind="layernorm")),
    "gpt2-untied": dict(attention=dict(q_bias=True, k_bias=True, v_bias=True, out_bias=True),
                        position=dict(kind="learned"), feed_forward=dict(activation="gelu", bias=True, d_ff=48),
                        normalization=dict(kind="layernorm", eps=1e-6), head=dict(tie=False)),
    "llama": dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False, num_kv_heads=2),
                  position=dict(kind="rope", base=500.0), feed_forward=dict(activation="swiglu", bias=False, d_ff=48),
                  normalization=dict(kind="rmsnorm"), head=dict(tie=False)),
    "llama-tied-bias": dict(attention=dict(q_bias=True, k_bias=True, v_bias=True, out_bias=True),
                            position=dict(kind="rope"), feed_forward=dict(activation="geglu", bias=True),
                            normalization=dict(kind="rmsnorm"), head=dict(tie=True)),
}


@pytest.mark.parametrize("shape", sorted(QKV_SHAPES))
def test_round_trip_qkv_to_hf_to_qkv_is_exact(shape, tmp_path):
    cfg = qkv.ModelConfig(vocab_size=64, d_model=32, attention=dict(num_heads=4), num_layers=2,
                          max_len=32).replace(**QKV_SHAPES[shape])
    model = randomize(qkv.GPT(cfg))
    hf = to_hf(model)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
    hf.save_pretrained(tmp_path)
    for back in (from_hf(hf), from_hf(tmp_path)):
        assert back.config.replace(feed_forward={"d_ff": back.config.ff_width}) == cfg.replace(feed_forward={"d_ff": cfg.ff_width})  # LLaMA spells 4·C out
        ours, theirs = model.state_dict(), back.state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert (back.lm_head.weight is back.embed.tok.weight) == cfg.head.tie
        with torch.no_grad():
            assert torch.equal(back(ids).logits, model(ids).logits)


@pytest.mark.parametrize("kind", DECODERS)
def test_round_trip_hf_to_qkv_to_hf_is_exact(saved, kind):
    hf = HF_CLASSES[kind].from_pretrained(saved[kind])
    again = to_hf(from_hf(saved[kind]))
    a, b = hf.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_in_memory_model_loads_like_its_directory(saved, kind):
    hf = HF_CLASSES[kind].from_pretrained(saved[kind])
    a, b = from_hf(hf).state_dict(), from_hf(saved[kind]).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_task_heads_and_buffers_are_skipped_but_other_heads_are_not(saved, tmp_path):
    """A TF-era BertForPreTraining checkpoint ("bert." prefix, LayerNorm gamma/beta, position_ids
    buffer, cls.* heads) loads as the same encoder; any other extra key is refused."""
    bert = HF_CLASSES["bert"].from_pretrained(saved["bert"])
    tensors = {f"bert.{k}".replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
               v.contiguous() for k, v in bert.state_dict().items()}
    tensors.update({"cls.predictions.bias": torch.zeros(96), "bert.embeddings.position_ids": torch.arange(64)[None]})
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((saved["bert"] / "config.json").read_text())
    a, b = from_hf(tmp_path).state_dict(), from_hf(saved["bert"]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    save_file({**tensors, "classifier.weight": torch.zeros(2, 32)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="1 unexpected keys: classifier.weight"):
        from_hf(tmp_path)


def test_dtype_and_eval_mode(saved):
    model = from_hf(saved["llama"], dtype=torch.bfloat16, dropout=0.1)
    assert model.lm_head.weight.dtype == torch.bfloat16 and not model.training and model.config.dropout == 0.1


# --- bad input: one ValueError naming every problem, never a half-loaded model -------------------

def copy_checkpoint(src, dst, edit_config=None, edit_tensors=None):
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if edit_config:
        edit_config(config)
    if edit_tensors:
        edit_tensors(tensors)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_directory_without_config_json(tmp_path):
    save_file({"wte.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="has no config.json"):
        from_hf(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        from_hf(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="is not a directory"):
        from_hf(tmp_path / "missing")


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(ValueError, match=r"model_type 't5' is not supported "
                                         r"\(qkv loads bert, deepseek_v2, deepseek_v3, gemma2, gemma3, gemma3_text, gpt2, "
                                         r"gpt_neox, gpt_oss, llama, marian, mistral, mixtral, olmo2, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, "
                                         r"smollm3\)"):
        from_hf(tmp_path)


def test_unsupported_settings_are_listed_together(saved, tmp_path):
    """(head_dim apart from hidden_size / heads and attention_bias != mlp_bias were on this list until the
    config had sections for them: tests/test_interop_families.py loads both.)"""
    def edit(c):
        c.update(hidden_act="relu", rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                     "partial_rotary_factor": 0.5})
    copy_checkpoint(saved["llama"], tmp_path, edit_config=edit)
    with pytest.raises(ValueError) as err:
        from_hf(tmp_path)
    msg = str(err.value)
    for part in ("hidden_act='relu'", "RoPE scaling 'llama3'", "partial_rotary_factor=0.5"):
        assert part in msg
    assert "\n" not in msg


def test_missing_unexpected_and_misshapen_keys_in_one_error(saved, tmp_path):
    def edit(t):
        del t["transformer.h.1.ln_2.bias"]
        t["transformer.h.0.attn.extra.weight"] = torch.zeros(3)
        t["transformer.wpe.weight"] = torch.zeros(63, 32)
        t["transformer.h.0.mlp.c_fc.weight"] = t["transformer.h.0.mlp.c_fc.weight"].t().contiguous()
    copy_checkpoint(saved["gpt2"], tmp_path, edit_tensors=edit)
    with pytest.raises(ValueError) as err:
        from_hf(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot load {tmp_path} as gpt2: ")
    assert "1 missing keys: transformer.h.1.ln_2.bias" in msg
    assert "1 unexpected keys: transformer.h.0.attn.extra.weight" in msg
    assert "2 wrong shapes" in msg
    assert "transformer.wpe.weight torch.float32 (63, 32) (expected floating (64, 32))" in msg
    assert "transformer.h.0.mlp.c_fc.weight torch.float32 (128, 32) (expected floating (32, 128))" in msg


def test_untied_head_missing_and_tied_head_inconsistent(saved, tmp_path):
    copy_checkpoint(saved["llama"], tmp_path, edit_tensors=lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match="1 missing keys: lm_head.weight"):
        from_hf(tmp_path)
    copy_checkpoint(saved["gpt2"], tmp_path, edit_tensors=lambda t: t.update({"lm_head.weight": torch.zeros(96, 32)}))
    with pytest.raises(ValueError, match="lm_head.weight differs from the token embedding"):
        from_hf(tmp_path)


def test_pickles_and_corrupt_files_are_refused(saved, tmp_path):
    (tmp_path / "config.json").write_text((saved["gpt2"] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ValueError, match="pytorch_model.bin: pickle files, which qkv never unpickles"):
        from_hf(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="cannot read .*model.safetensors"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*config.json"):
        from_hf(tmp_path)


def test_config_values_are_validated(saved, tmp_path):
    copy_checkpoint(saved["gpt2"], tmp_path, edit_config=lambda c: c.update(n_head=5))
    with pytest.raises(ValueError, match=r"d_model \(32\) must be divisible by num_heads \(5\)"):
        from_hf(tmp_path)


def test_from_hf_and_to_hf_reject_wrong_types():
    with pytest.raises(TypeError, match="expects a directory path or a transformers model, got int"):
        from_hf(42)
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16 or a floating "
                                         "torch.dtype, got 'fp32'"):
        from_hf("anywhere", dtype="fp32")
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype, got torch.int64"):
        from_hf("anywhere", dtype=torch.int64)
    with pytest.raises(TypeError, match="converts a qkv.GPT"):
        to_hf(qkv.Encoder(qkv.PRESETS["tiny"]))
    with pytest.raises(ValueError, match=r"position.kind='learned' \(GPT-2\) or position.kind='rope' and normalization.kind='rmsnorm' "
                                         r"\(LLaMA\) or position.kind='rope' and normalization.kind='layernorm' \(GPT-NeoX\) or .* \(Mistral\) "
                                         r"or position.kind='rope' and normalization.kind='rmsnorm_plus_one' \(Gemma2\) or .* "
                                         r"\(Gemma3\) or .* \(DeepSeek-V3\) or .* \(DeepSeek-V2\) or .* \(SmolLM3\) "
                                         r"or .* \(OLMo2\) or .* \(Phi-3\) or .* \(Mixtral\) or .* \(Qwen2-MoE\) "
                                         r"or .* \(Qwen3-MoE\) or .* \(gpt-oss\); "
                                         r"got position.kind='alibi', normalization.kind='layernorm'"):
        to_hf(qkv.GPT(qkv.ModelConfig.preset("tiny", position=dict(kind="alibi"))))
    with pytest.raises(ValueError, match="GPT-2 counterpart .*normalization.kind='rmsnorm' .*bias=False"):
        to_hf(qkv.GPT(qkv.ModelConfig.preset("tiny",
                                             attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                                             feed_forward=dict(bias=False), normalization=dict(kind="rmsnorm"))))
    with pytest.raises(ValueError, match="LLaMA counterpart .*activation='gelu'"):
        to_hf(qkv.GPT(qkv.ModelConfig.preset("tiny", position=dict(kind="rope"), normalization=dict(kind="rmsnorm"))))


# --- the tokenizer beside the weights (fixture with_tokenizer: conftest.py) ----------------------------


def test_load_pretrained_returns_model_and_tokenizer(with_tokenizer):
    model, tok = load_pretrained(with_tokenizer)
    auto = transformers.AutoTokenizer.from_pretrained(with_tokenizer, local_files_only=True)
    text = "the dog bites héllo"
    ids = tok.encode(text)
    assert ids == auto.encode(text) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text and tok.decode(torch.tensor(ids)) == text
    assert len(tok.token_strings(ids)) == len(ids)
    assert "".join(tok.token_strings(tok.encode("the man bites"))) == "the man bites"
    assert tok.token_strings(tok.encode("the dog"))[-1] == " dog"  # readable text, not "Ġdog"
    assert tok.vocab_size == len(auto) == model.config.vocab_size
    assert tok.eos_id == auto.convert_tokens_to_ids("<|endoftext|>")
    out = model.generate(torch.tensor([ids]), 3, temperature=0)
    assert isinstance(tok.decode(out[0]), str)


def test_tokenizers_backend_agrees_with_transformers(with_tokenizer):
    from tokenizers import Tokenizer as Fast

    slow_path = Tokenizer(Fast.from_file(str(with_tokenizer / "tokenizer.json")))
    auto = find_tokenizer(with_tokenizer)
    text = "attention is all the dog needs"
    assert slow_path.encode(text) == auto.encode(text)
    ids = auto.encode(text)
    assert slow_path.decode(ids) == auto.decode(ids) == text
    assert slow_path.token_strings(ids) == auto.token_strings(ids)
    assert slow_path.vocab_size == auto.vocab_size


def test_tokenizer_edge_cases(saved, with_tokenizer, tmp_path):
    assert load_pretrained(saved["gpt2"])[1] is None  # no tokenizer files: None, not an error
    tok = find_tokenizer(with_tokenizer)
    with pytest.raises(ValueError, match=r"token ids must be ints in \[0, 300\)"):
        tok.decode([1, 300])
    with pytest.raises(TypeError, match="token ids must be a sequence of ints"):
        tok.token_strings([1.0])
    assert tok.decode(torch.tensor([5, 6])) == tok.decode([5, 6])
    with pytest.raises(TypeError, match="encode expects a str"):
        tok.encode([1, 2])
    for f in with_tokenizer.iterdir():
        if "token" in f.name:
            (tmp_path / f.name).write_bytes(f.read_bytes())
    small = HF_MODELS["gpt2"]()
    small.save_pretrained(tmp_path)  # 96 embeddings, a 300-token tokenizer
    with pytest.raises(ValueError, match="has 300 tokens but the model only 96 embeddings"):
        load_pretrained(tmp_path)


def test_bert_wordpiece_vocab_txt(saved, tmp_path):
    for f in saved["bert"].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "bit", "man", "##s", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    model, tok = load_pretrained(tmp_path)
    ids = tok.encode("The dog bits the man.")
    assert tok.token_strings(ids) == ["[CLS]", "the", "dog", "bit", "##s", "the", "man", ".", "[SEP]"]
    assert tok.decode(ids) == "[CLS] the dog bits the man. [SEP]"
    assert model(torch.tensor([ids])).last_hidden_state.shape == (1, 9, 32)


def test_sharded_checkpoint(saved, tmp_path):
    HF_CLASSES["llama"].from_pretrained(saved["llama"]).save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    a, b = from_hf(tmp_path).state_dict(), from_hf(saved["llama"]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names shards that are not files in .*\['../elsewhere.safetensors'\]"):
        from_hf(tmp_path)


def test_the_old_name_of_find_tokenizer_still_works_with_a_warning(with_tokenizer):
    from qkv.interop import hf

    with pytest.warns(DeprecationWarning, match="find_tokenizer"):
        assert hf.load_tokenizer(with_tokenizer).vocab_size == find_tokenizer(with_tokenizer).vocab_size
