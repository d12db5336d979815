"""A model loaded from a Hugging Face checkpoint carries its generation settings (``model.generation_config``,
a ``qkv.generation.GenerationConfig``): ``generate`` with no extra argument decodes as HF's ``generate`` does —
Marian with its beams, length penalty, start token and suppressed pad; a decoder stops at any of its eos ids —
explicit arguments still win, and ``to_hf`` writes the settings back as generation_config.json.

No network: tiny random models saved with save_pretrained into tmp_path.
"""
import json

import pytest
import torch

import qkv
from qkv.generation import GenerationConfig
from qkv.interop import from_hf, to_hf

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from hf_models import hf_model  # noqa: E402  (tiny random open-family models, shared with other tests)

V, EOS = 40, 0
PAD = V - 1
MARIAN = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=48, decoder_ffn_dim=48, activation_function="swish", scale_embedding=True,
              max_position_embeddings=64)
BEAMS = dict(num_beams=3, length_penalty=0.6, bad_words_ids=[[PAD]], decoder_start_token_id=PAD, eos_token_id=EOS,
             forced_eos_token_id=EOS, pad_token_id=PAD, max_length=14, renormalize_logits=True)


def random_marian(seed: int):
    """A MarianMTModel whose logits bias favours EOS and pad, so hypotheses end early and suppression matters."""
    config = transformers.MarianConfig(vocab_size=V, pad_token_id=PAD, decoder_start_token_id=PAD,
                                       eos_token_id=EOS, forced_eos_token_id=EOS, **MARIAN)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.copy_((1.0 if p.dim() == 1 and name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
        bias = 0.5 * torch.randn(1, V, generator=g)
        bias[0, EOS] += 2.5
        bias[0, PAD] += 3.0
        model.final_logits_bias.copy_(bias)
    model.generation_config = transformers.GenerationConfig(**BEAMS)
    return model.eval()


@pytest.fixture(scope="module")
def marian_dirs(tmp_path_factory):
    dirs = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"marian{seed}")
        random_marian(seed).save_pretrained(d)
        dirs.append(d)
    return dirs


def sources(seed: int, B: int = 6, S: int = 9):
    """Sources (B, S) ending in EOS, right-padded with pad, and the mask of real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, S + 1, (B,), generator=g)
    lengths[0] = S
    mask = torch.arange(S) < lengths[:, None]
    src = torch.randint(2, V - 1, (B, S), generator=g).masked_fill(~mask, PAD)
    src[torch.arange(B), lengths - 1] = EOS
    return src, mask


# --- Marian: the checkpoint's beam search, with no argument -----------------------------------------------

def test_marian_generate_with_no_argument_is_hf_generate(marian_dirs):
    beams_mattered = False
    for i, d in enumerate(marian_dirs):
        model, hf = from_hf(d), transformers.MarianMTModel.from_pretrained(d).eval()
        assert model.generation_config.num_beams == 3 and model.generation_config.length_penalty == 0.6
        assert model.generation_config.suppress == (PAD,) and model.generation_config.decoder_start_id == PAD
        src, mask = sources(seed=i + 5)
        want = hf.generate(input_ids=src, attention_mask=mask.long())
        got = model.generate(src, src_mask=mask)
        assert got.tolist() == want.tolist()
        greedy = model.generate(src, src_mask=mask, num_beams=1)
        beams_mattered |= greedy.tolist() != got.tolist()
    assert beams_mattered  # the checkpoint's num_beams was used, not qkv's greedy default


def test_marian_explicit_arguments_win(marian_dirs):
    model, hf = from_hf(marian_dirs[0]), transformers.MarianMTModel.from_pretrained(marian_dirs[0]).eval()
    src, mask = sources(seed=3)
    for kwargs in (dict(num_beams=1, max_new_tokens=5), dict(num_beams=2, length_penalty=1.5, max_new_tokens=8)):
        want = hf.generate(input_ids=src, attention_mask=mask.long(), **kwargs)
        assert model.generate(src, src_mask=mask, **kwargs).tolist() == want.tolist(), kwargs


def test_marian_round_trip_through_to_hf_keeps_the_generation_config(marian_dirs, tmp_path):
    model = from_hf(marian_dirs[0])
    to_hf(model).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "generation_config.json").read_text())
    for key, value in BEAMS.items():
        assert written[key] == value, key
    assert json.loads((tmp_path / "config.json").read_text())["decoder_start_token_id"] == PAD
    again = from_hf(tmp_path)
    assert again.generation_config == model.generation_config
    src, mask = sources(seed=4)
    assert torch.equal(again.generate(src, src_mask=mask), model.generate(src, src_mask=mask))


# --- a decoder stops at any of its eos ids ---------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A Qwen2-shaped checkpoint, its greedy continuation of a prompt, and an eos list naming an unused id
    first and, second, the first token that continuation emits for the first time at its 4th step or later."""
    d = tmp_path_factory.mktemp("qwen2")
    hf = hf_model("qwen2")
    hf.save_pretrained(d)
    prompt = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    free = from_hf(d).generate(prompt, 24, eos_id=None)[0, 6:].tolist()  # explicit None: never stop
    k = next(i for i in range(3, len(free)) if free[i] not in free[:i])
    unused = next(t for t in range(96) if t not in free)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [unused, free[k]], "pad_token_id": unused}))
    return d, prompt, free, k


def test_a_decoder_stops_at_the_second_of_its_eos_ids_as_hf(qwen):
    d, prompt, free, k = qwen
    model = from_hf(d)
    assert len(model.generation_config.eos_ids) == 2
    got = model.generate(prompt, 24)  # greedy, as HF's generate without do_sample
    assert got[0, 6:].tolist() == free[:k + 1]  # stopped right after the second eos id
    hf = transformers.Qwen2ForCausalLM.from_pretrained(d).eval()
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24)
    assert got.tolist() == want.tolist()


def test_a_decoder_batch_pads_finished_rows_as_hf(qwen):
    d, prompt, free, k = qwen
    model, hf = from_hf(d), transformers.Qwen2ForCausalLM.from_pretrained(d).eval()
    other = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(8))
    ids = torch.cat([prompt, other])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24)
    assert model.generate(ids, 24).tolist() == want.tolist()


def test_a_decoder_explicit_arguments_win(qwen):
    d, prompt, free, k = qwen
    model = from_hf(d)
    assert model.generate(prompt, 24, eos_id=None)[0, 6:].tolist() == free  # no stop
    assert model.generate(prompt, 3)[0, 6:].tolist() == free[:3]
    sampled = model.generate(prompt, 24, temperature=1.0, seed=0, eos_id=None)
    assert sampled.shape == (1, 30)  # sampling asked for: not the greedy default
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt)  # the checkpoint gives no max_new_tokens or max_length


def test_sampling_settings_and_max_length_come_from_the_checkpoint(qwen, tmp_path):
    d, prompt, free, k = qwen
    hf = transformers.Qwen2ForCausalLM.from_pretrained(d)
    hf.generation_config = transformers.GenerationConfig(do_sample=True, top_k=1, max_length=10)
    model = from_hf(hf)  # an in-memory transformers model: its generation_config is read too
    assert model.generation_config.do_sample and model.generation_config.top_k == 1
    out = model.generate(prompt, seed=3)  # top-k 1 samples the argmax; max_length counts the prompt
    assert out[0, 6:].tolist() == free[:4]


def test_round_trip_of_a_decoder_keeps_its_eos_list(qwen, tmp_path):
    d, prompt, free, k = qwen
    model = from_hf(d)
    to_hf(model).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == list(
        model.generation_config.eos_ids)
    assert from_hf(tmp_path).generation_config == model.generation_config


# --- the dataclass, and models built without a checkpoint ------------------------------------------------

def test_settings_qkv_cannot_apply_are_named_in_one_warning(qwen, tmp_path):
    d, *_ = qwen
    for f in ("config.json", "model.safetensors"):
        (tmp_path / f).write_bytes((d / f).read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "repetition_penalty": 1.1,
                                                                 "no_repeat_ngram_size": 0, "top_k": "many"}))
    with pytest.warns(UserWarning, match=r"settings: top_k='many' \(expected int\); repetition_penalty=1.1$"):
        model = from_hf(tmp_path)
    assert model.generation_config.eos_ids == (2,) and model.generation_config.top_k == 50  # HF's default


def test_to_dict_from_dict_and_hf_keys():
    config = GenerationConfig(eos_ids=(3, 5), pad_id=1, suppress=(7,), num_beams=4, do_sample=True, top_k=None)
    assert GenerationConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.to_hf() == {"pad_token_id": 1, "eos_token_id": [3, 5], "bad_words_ids": [[7]], "num_beams": 4,
                              "do_sample": True, "top_k": 0}
    assert GenerationConfig.from_hf(config.to_hf()) == config
    with pytest.raises(TypeError, match=r"no fields \['beams'\]"):
        GenerationConfig.from_dict({"beams": 4})


def test_a_model_built_without_a_checkpoint_behaves_as_before():
    gpt = qkv.GPT(qkv.ModelConfig(vocab_size=20, d_model=16, num_layers=1, attention=dict(num_heads=2), max_len=16))
    assert gpt.generation_config is None
    ids = torch.tensor([[1, 2, 3]])
    assert gpt.generate(ids, 5, seed=0).shape == (1, 8)  # samples at temperature 1, never stops
    with pytest.raises(ValueError, match="max_new_tokens"):
        gpt.generate(ids)
    seq2seq = qkv.Transformer(qkv.ModelConfig(vocab_size=20, d_model=16, num_layers=1, attention=dict(num_heads=2),
                                              max_len=16))
    assert seq2seq.generation_config is None
    with pytest.raises(ValueError, match="special="):
        seq2seq.generate(ids)


def test_generate_checks_its_stop_ids():
    gpt = qkv.GPT(qkv.ModelConfig(vocab_size=20, d_model=16, num_layers=1, attention=dict(num_heads=2), max_len=16))
    with pytest.raises(ValueError, match=r"eos_id must be a token id or a non-empty list of them .*got \[\]"):
        gpt.generate(torch.tensor([[1, 2]]), 3, eos_id=[])
    out = gpt.generate(torch.tensor([[1, 2]]), 6, temperature=0, suppress=list(range(1, 20)))
    assert out[0, 2:].tolist() == [0] * 6  # every other id suppressed
