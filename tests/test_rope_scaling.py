"""RoPE scaling (qkv.nn.rope_scaling, RotaryEmbedding(scaling=), position.scaling, LLaMA's rope_scaling /
rope_parameters): the inverse frequencies and attention factors of transformers' ROPE_INIT_FUNCTIONS, the
dynamic and longrope updates of its dynamic_rope_update, a tiny LlamaForCausalLM per type (logits past
original_max_position_embeddings, greedy tokens, export round trips), 4.x spellings, and the refusals.

No network: HF models are random-initialised from tiny configs and saved with save_pretrained.
"""
import dataclasses
import json

import pytest
import torch

import qkv
from qkv import cli
from qkv.interop import from_hf, to_hf
from qkv.kernels import fused_step
from qkv.nn.rope_scaling import FIELDS, RopeScaling, rope_frequencies

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

HEADS, WIDTH, L0, TOP = 4, 32, 16, 64  # head_dim 8; trained on 16 positions, 64 in the scaled config
PAIRS = WIDTH // HEADS // 2
SCALINGS = {  # name -> rope parameters as transformers 5 spells them (rope_theta apart)
    "linear": dict(rope_type="linear", factor=2.0),
    "dynamic": dict(rope_type="dynamic", factor=4.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=L0),
    "yarn, mscale, no truncation": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=L0,
                                        beta_fast=8.0, beta_slow=2.0, mscale=0.707, mscale_all_dim=1.0,
                                        truncate=False),
    "yarn, attention_factor": dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=L0,
                                   attention_factor=1.25),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=L0),
    "longrope": dict(rope_type="longrope", factor=4.0, original_max_position_embeddings=L0,
                     short_factor=[1.0 + 0.1 * i for i in range(PAIRS)],
                     long_factor=[1.5 + 0.5 * i for i in range(PAIRS)]),
}


def hf_config(rope: dict, **settings) -> LlamaConfig:
    """A tiny LlamaConfig; dynamic rescales past max_position_embeddings, so it gets L0 there."""
    top = L0 if rope["rope_type"] == "dynamic" else TOP
    settings = dict(vocab_size=96, hidden_size=WIDTH, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=top, rms_norm_eps=1e-5,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None) | settings
    return LlamaConfig(rope_parameters={**rope, "rope_theta": 500.0}, **settings)


def qkv_scaling(rope: dict) -> RopeScaling:
    """The same scaling as qkv's RopeScaling (dynamic: L₀ is HF's max_position_embeddings)."""
    fields = {("type" if k == "rope_type" else k): v for k, v in rope.items()}
    if fields["type"] == "dynamic":
        fields["original_max_position_embeddings"] = L0
    return RopeScaling(**fields)


# --- the functions against transformers' -------------------------------------------------------------

@pytest.mark.parametrize("name", SCALINGS)
@pytest.mark.parametrize("seq_len", [None, 10, 40])
def test_frequencies_and_attention_factor_equal_transformers(name, seq_len):
    rope = SCALINGS[name]
    hf = hf_config(rope)
    want, want_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu", seq_len=seq_len)
    got, factor = rope_frequencies(WIDTH // HEADS, 500.0, qkv_scaling(rope), seq_len)
    assert got.dtype == torch.float32 and got.shape == (PAIRS,)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert factor == pytest.approx(float(want_factor), abs=1e-6)


@pytest.mark.parametrize("name", ["linear", "yarn", "llama3"])
def test_partial_rotation_scales_the_rotated_dims_as_transformers(name):
    """rotary_dim R = head_dim · partial_rotary_factor: the functions see R, as transformers' do."""
    rope = SCALINGS[name]
    hf = hf_config({**rope, "partial_rotary_factor": 0.5}, hidden_size=64)  # head_dim 16, R = 8
    want, want_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    module = qkv.RotaryEmbedding(16, 500.0, rotary_dim=8, scaling=qkv_scaling(rope))
    torch.testing.assert_close(module.inv_freq, want, atol=1e-6, rtol=0)
    assert module.attention_factor == pytest.approx(want_factor, abs=1e-6)


def test_the_formulas_hold():
    """linear divides θ by s; llama3 keeps the highest frequency and divides the lowest by s; yarn's factor is
    0.1·ln s + 1; plain RoPE is RopeScaling() (and no scaling at all)."""
    plain, _ = rope_frequencies(8, 500.0)
    torch.testing.assert_close(rope_frequencies(8, 500.0, RopeScaling(type="linear", factor=2.0))[0], plain / 2)
    llama31 = RopeScaling(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)  # Llama 3.1's, at base 500 000
    plain31, llama3 = rope_frequencies(8, 5e5)[0], rope_frequencies(8, 5e5, llama31)[0]
    assert llama3[0] == plain31[0] and llama3[-1] == pytest.approx(plain31[-1].item() / 8)
    _, yarn = rope_frequencies(8, 500.0, qkv_scaling(SCALINGS["yarn"]))
    assert yarn == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    torch.testing.assert_close(qkv.RotaryEmbedding(8, 500.0, scaling=RopeScaling()).inv_freq,
                               qkv.RotaryEmbedding(8, 500.0).inv_freq, atol=0, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_cos_and_sin_carry_the_attention_factor(interleaved):
    """q and k rotated by a yarn RoPE are the plain rotation by the scaled θ, times the attention factor."""
    scaling = qkv_scaling(SCALINGS["yarn"])
    rope = qkv.RotaryEmbedding(8, 500.0, interleaved, scaling=scaling)
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0))
    plain = qkv.RotaryEmbedding(8, 500.0, interleaved)
    plain.inv_freq = rope.inv_freq.clone()
    torch.testing.assert_close(rope(x, 7), plain(x, 7) * rope.attention_factor)


def test_the_rotation_equals_llamas_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    rope_params = SCALINGS["yarn, mscale, no truncation"]
    hf = LlamaRotaryEmbedding(hf_config(rope_params))
    q, k = torch.randn(2, 2, 30, 8, generator=torch.Generator().manual_seed(1)).unbind(0)
    q, k = q[None], k[None]  # (1, H=2, T=30, D=8)
    positions = torch.arange(30)[None]
    cos, sin = hf(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = qkv.RotaryEmbedding(8, 500.0, scaling=qkv_scaling(rope_params))
    torch.testing.assert_close(rope(q), want_q, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rope(k), want_k, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
def test_length_dependent_types_follow_the_length_as_transformers(name):
    """dynamic: θ recomputed when the length grows past the longest so far (beyond L₀), kept while longer than
    L₀, the original θ again for an input within L₀; longrope: the long factors while the length passes L₀.
    The same calls to LlamaRotaryEmbedding and to qkv's give the same cos and sin."""
    rope_params = SCALINGS[name]
    hf, rope = LlamaRotaryEmbedding(hf_config(rope_params)), qkv.RotaryEmbedding(8, 500.0,
                                                                                    scaling=qkv_scaling(rope_params))
    x = torch.zeros(1, 1, 1, 8)
    for positions in (torch.arange(10), torch.arange(30), torch.tensor([30]), torch.arange(20), torch.tensor([44]),
                      torch.arange(5), torch.tensor([[3, 25], [0, 1]])):
        cos, sin = hf(x, positions if positions.dim() == 2 else positions[None])
        got_cos, got_sin = rope.angles(positions)
        torch.testing.assert_close(got_cos, cos[..., :PAIRS].reshape(got_cos.shape), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got_sin, sin[..., :PAIRS].reshape(got_sin.shape), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(rope.inv_freq, hf.inv_freq, atol=1e-6, rtol=1e-6)


# --- the configuration ------------------------------------------------------------------------------

def scaled(scaling, **settings) -> qkv.ModelConfig:
    return qkv.ModelConfig(vocab_size=64, d_model=32, num_layers=1, max_len=64,
                           attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                           feed_forward=dict(bias=False, activation="swiglu"), normalization=dict(kind="rmsnorm"),
                           position=dict(kind="rope", base=500.0, scaling=scaling)).replace(**settings)


@pytest.mark.parametrize("name", SCALINGS)
def test_position_scaling_round_trips_through_config_json_readably(name, tmp_path):
    scaling = qkv_scaling(SCALINGS[name])
    config = scaled(scaling.to_dict())  # a dict is taken and validated into a RopeScaling
    assert config.position.scaling == scaling and isinstance(config.position.scaling, RopeScaling)
    written = json.loads(json.dumps(config.to_dict()))
    assert written["position"]["scaling"] == {("type" if k == "rope_type" else k): v
                                              for k, v in SCALINGS[name].items()} | (
        {"original_max_position_embeddings": L0} if name == "dynamic" else {})
    assert qkv.ModelConfig.from_dict(written) == config and hash(qkv.ModelConfig.from_dict(written)) == hash(config)
    assert qkv.GPT(config).blocks[0].attn.rope.scaling == scaling  # the factory passes it on


@pytest.mark.parametrize("scaling, message", [
    (dict(type="ntk-by-parts", factor=2.0), r"position.scaling: unknown RoPE scaling type 'ntk-by-parts'; known "
                                            r"types: \['default', 'dynamic', 'linear', 'llama3', 'longrope', 'yarn'\]"),
    (dict(type="linear"), r"RoPE scaling 'linear' needs factor \(it takes \['factor'\]\)"),
    (dict(type="linear", factor=0.0), r"factor must be a positive number, got 0.0"),
    (dict(type="linear", factor=-2), r"factor must be a positive number, got -2"),
    (dict(type="yarn", factor=4.0), r"'yarn' needs original_max_position_embeddings"),
    (dict(type="llama3", factor=8.0, original_max_position_embeddings=16), r"needs low_freq_factor, high_freq_factor"),
    (dict(type="llama3", factor=8.0, original_max_position_embeddings=16, low_freq_factor=4.0, high_freq_factor=1.0),
     r"high_freq_factor > low_freq_factor, got 1.0 and 4.0"),
    (dict(type="linear", factor=2.0, beta_fast=32), r"'linear' does not read \['beta_fast'\]"),
    (dict(type="linear", factor=2.0, scale=3), r"unknown RoPE scaling keys \['scale'\]"),
    (dict(type="longrope", factor=4.0, original_max_position_embeddings=16, short_factor=[1.0] * 3,
          long_factor=[1.0] * 3), r"short_factor needs 4 numbers \(one per pair of the 8 rotated dims\), got 3"),
    (dict(type="yarn", factor=4.0, original_max_position_embeddings=0), r"a positive int, got 0"),
    ("linear", r"must be a RopeScaling or a dict of its fields, got str"),
])
def test_bad_scalings_are_refused_naming_what_was_given(scaling, message):
    with pytest.raises((ValueError, TypeError), match=message):
        scaled(scaling)


def test_scaling_needs_rope():
    with pytest.raises(ValueError, match=r"position.scaling scales RoPE: it needs positional 'rope', got .*'learned'"):
        qkv.ModelConfig(d_model=32, attention=dict(num_heads=4),
                        position=dict(kind="learned", scaling=dict(type="linear", factor=2)))


@pytest.mark.parametrize("name", SCALINGS)
def test_the_fused_step_takes_the_static_scalings_and_refuses_the_length_dependent_ones(name):
    """The fused step's RoPE table is built once for the whole cache from the module's own angles: right for the
    static scalings (tests/test_fused_step_families.py compares its tokens), wrong for dynamic NTK and longrope,
    whose θ follow the current length, so those are refused (generate falls back to the reference step)."""
    model = qkv.GPT(scaled(qkv_scaling(SCALINGS[name]))).eval()
    reason = fused_step.refuses(model, 1)
    if SCALINGS[name]["rope_type"] in ("dynamic", "longrope"):
        assert reason.startswith("config field position.scaling=RopeScaling(type=") and "table is fixed" in reason
    else:
        assert reason is None
    assert fused_step.refuses(qkv.GPT(scaled(None)).eval(), 1) is None


# --- LLaMA checkpoints --------------------------------------------------------------------------------

def random_llama(rope: dict, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model, g = LlamaForCausalLM(hf_config(rope)), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if p.dim() == 1 else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    dirs = {}
    for name, rope in SCALINGS.items():
        dirs[name] = tmp_path_factory.mktemp(name.split(",")[0])
        random_llama(rope).save_pretrained(dirs[name])
    return dirs


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_llamas_load_with_hf_logits_past_the_trained_context(saved, name):
    """A right-padded batch of 40 tokens (L₀ = 16): logits within 1e-4 of HF eager at every real position."""
    hf = LlamaForCausalLM.from_pretrained(saved[name], attn_implementation="eager").eval()
    model = from_hf(saved[name])
    assert model.config.position.scaling == qkv_scaling(SCALINGS[name])
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 30:] = False
    with torch.no_grad():
        want = hf(ids, attention_mask=mask.long()).logits
        got = model(ids, mask=mask).logits
    assert (got - want)[mask].abs().max() < 1e-4


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_llamas_generate_hf_greedy_tokens(saved, name):
    """A 20-token prompt past L₀ = 16 and 32 new tokens: HF generate's greedy tokens (dynamic with its cache, as
    HF's: keys keep the θ they were rotated with)."""
    hf, model = LlamaForCausalLM.from_pretrained(saved[name]).eval(), from_hf(saved[name])
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(2))
    want = hf.generate(ids, max_new_tokens=32, do_sample=False, min_new_tokens=32)
    assert torch.equal(model.generate(ids, 32, temperature=0), want)


@pytest.mark.parametrize("name", ["dynamic", "longrope", "yarn"])
def test_a_left_padded_batch_decodes_hf_logits_past_the_trained_context(saved, name):
    """Prompts of 10 and 6 real tokens (row 1 left-padded by 4), then 16 of HF's greedy tokens fed one at a time
    through the static cache, past L₀ = 16: every step's logits within 1e-4 of HF generate's, in both rows.
    dynamic and longrope change θ mid-decode, so where a padded row rotates matters: at its real positions, as
    HF's position_ids (at its cache slots the row's phase would drift by pad · Δθ)."""
    from qkv.generation.decode import StaticCache

    hf, model = LlamaForCausalLM.from_pretrained(saved[name]).eval(), from_hf(saved[name])
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                      pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    cache = StaticCache(model, 2, 26, device="cpu")
    with torch.no_grad():
        got = [cache.prefill(ids, mask.bool())] + [cache.step(out.sequences[:, 10 + i], 10 + i) for i in range(15)]
    gap = max((g - w).abs().max().item() for g, w in zip(got, out.logits, strict=True))
    assert gap < 1e-4


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_llamas_round_trip_exactly(saved, name, tmp_path):
    model = from_hf(saved[name])
    to_hf(model).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((saved[name] / "config.json").read_text())
    assert written["rope_parameters"] == original["rope_parameters"]
    assert written["max_position_embeddings"] == original["max_position_embeddings"]
    again = from_hf(tmp_path)
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_dynamic_max_len_is_the_stretched_context_and_must_match_on_export():
    """HF's dynamic rescales past max_position_embeddings L₀ and has no limit; qkv reads max_len = factor · L₀
    (generate's window) and writes L₀ back, refusing a max_len it would not read back."""
    model = from_hf(random_llama(SCALINGS["dynamic"]))
    assert model.config.max_len == 4 * L0
    odd = qkv.GPT(model.config.replace(max_len=50))
    with pytest.raises(ValueError, match=r"max_len=50 with dynamic RoPE scaling \(Hugging Face keeps "
                                         r"max_position_embeddings=16, which is read back as max_len = "
                                         r"factor × 16 = 64\)"):
        to_hf(odd)


def as_4x(config: dict, *, key: str = "rope_type") -> dict:
    """A 5.x config.json as 4.x wrote it: rope_scaling (``key`` "type" before 4.43) and rope_theta at the top."""
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype")}
    rope = dict(config["rope_parameters"])
    theta = rope.pop("rope_theta")
    rope[key] = rope.pop("rope_type")
    return old | dict(rope_scaling=rope, rope_theta=theta, torch_dtype="float32", transformers_version="4.45.0")


@pytest.mark.parametrize("name, key", [("linear", "type"), ("dynamic", "type"), ("llama3", "rope_type"),
                                       ("yarn", "rope_type"), ("longrope", "rope_type")])
def test_a_4x_config_json_loads_as_its_5x_spelling(saved, name, key, tmp_path):
    for f in saved[name].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(as_4x(json.loads((saved[name] / "config.json").read_text()),
                                                           key=key)))
    assert from_hf(tmp_path).config == from_hf(saved[name]).config


def test_a_phi3_style_top_level_original_max_position_embeddings_wins(saved, tmp_path):
    """transformers takes a top-level original_max_position_embeddings over the one in rope_parameters."""
    for f in saved["longrope"].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((saved["longrope"] / "config.json").read_text())
    config["original_max_position_embeddings"] = 32
    del config["rope_parameters"]["factor"]  # then max_position_embeddings / L₀, as transformers computes it
    (tmp_path / "config.json").write_text(json.dumps(config))
    scaling = from_hf(tmp_path).config.position.scaling
    assert (scaling.original_max_position_embeddings, scaling.factor) == (32, TOP / 32)


def unknown_type_dir(saved, tmp_path):
    tmp_path.mkdir()
    for f in saved["linear"].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((saved["linear"] / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "mystery", "factor": 2.0, "rope_theta": 500.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_an_unknown_rope_type_is_one_clear_error(saved, tmp_path):
    with pytest.raises(ValueError, match=r"^cannot load .* as llama: RoPE scaling 'mystery' is not supported \(qkv "
                                         r"knows rope_type 'default', 'linear', 'dynamic', 'yarn', 'llama3', "
                                         r"'longrope'\)$"):
        from_hf(unknown_type_dir(saved, tmp_path / "model"))


def test_qkv_sample_hf_refuses_an_unknown_rope_type_with_exit_2(saved, tmp_path, capsys, monkeypatch):
    directory = unknown_type_dir(saved, tmp_path / "model")
    before = sorted(p.name for p in directory.iterdir())
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sample", "--hf", str(directory), "--prompt", "a", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "RoPE scaling 'mystery' is not supported" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in directory.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_bad_scaling_in_a_checkpoint_names_the_rope_type(saved, tmp_path):
    for f in saved["llama3"].iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((saved["llama3"] / "config.json").read_text())
    config["rope_parameters"]["factor"] = -1.0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"rope_type 'llama3': RoPE scaling factor must be a positive number, "
                                         r"got -1.0"):
        from_hf(tmp_path)


def test_gpt_neox_export_refuses_a_scaled_model():
    config = qkv.ModelConfig(vocab_size=64, d_model=32, attention=dict(num_heads=4), num_layers=1, max_len=32,
                             position=dict(kind="rope", scaling=dict(type="linear", factor=2.0)))
    with pytest.raises(ValueError, match=r"GPT-NeoX counterpart.*position.scaling type 'linear' \(GPT-NeoX is "
                                         r"written with plain RoPE\)"):
        to_hf(qkv.GPT(config))


def test_every_type_has_a_test_here():
    assert {r["rope_type"] for r in SCALINGS.values()} == set(FIELDS) - {"default"}
    assert [f.name for f in dataclasses.fields(RopeScaling)][0] == "type"
