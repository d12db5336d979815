"""qkv.interop.hf's families: the settings the config sections made loadable (LLaMA's head_dim apart from
hidden_size / heads, attention_bias apart from mlp_bias) in both directions, the config spellings of
transformers 4.x beside 5.x, the activation names derived from qkv.nn.layers.ACTIVATIONS, and the registry.

No network: HF models are random-initialised from tiny configs and saved with save_pretrained; the 4.x
configs are written here as that version wrote them (rope_theta at the top level, rope_scaling, torch_dtype,
no head_dim before 4.45, no mlp_bias before 4.41).
"""
import dataclasses
import json

import pytest
import torch

import qkv
from qkv.interop import from_hf, to_hf
from qkv.interop.hf import FAMILIES, Family, hf_config, register_family
from qkv.interop.hf.families import gpt2, llama
from qkv.interop.hf.settings import hf_to_qkv, plain_rope_base, qkv_to_hf, rope_parameters
from qkv.nn.layers import ACTIVATIONS

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMAS = {  # what the flat config could not hold: head_dim 12 with C = 32, H = 4; the biases apart
    "head_dim": dict(head_dim=12),
    "attention_bias": dict(attention_bias=True, mlp_bias=False),
    "mlp_bias": dict(attention_bias=False, mlp_bias=True),
}


def random_llama(seed: int, **settings) -> LlamaForCausalLM:
    """A tiny LlamaForCausalLM, every parameter ~ N(0, 0.2²) (norm weights 1 ± 0.2)."""
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **NO_SPECIAL, **settings)
    torch.manual_seed(seed)
    model, g = LlamaForCausalLM(config), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if p.dim() == 1 and name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{kind: directory} of the LLAMAS written by save_pretrained."""
    dirs = {}
    for i, (kind, settings) in enumerate(LLAMAS.items()):
        dirs[kind] = tmp_path_factory.mktemp(kind)
        random_llama(i, **settings).save_pretrained(dirs[kind])
    return dirs


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- LLaMA settings that were problems before the config had sections --------------------------------

@pytest.mark.parametrize("kind", sorted(LLAMAS))
def test_llama_settings_load_with_hf_numbers(saved, kind):
    model, hf = from_hf(saved[kind]), LlamaForCausalLM.from_pretrained(saved[kind]).eval()
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(ids).logits
    assert theirs.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert model.generate(ids[:1, :5], 12, temperature=0).tolist() == hf.generate(
        ids[:1, :5], attention_mask=torch.ones(1, 5, dtype=torch.long), max_new_tokens=12, do_sample=False,
        pad_token_id=0).tolist()


def test_llama_sections_say_what_the_config_said(saved):
    a = from_hf(saved["head_dim"]).config
    assert (a.attention.head_dim, a.head_dim, a.kv_heads, a.d_model) == (12, 12, 2, 32)
    assert from_hf(saved["head_dim"]).blocks[0].attn.q_proj.weight.shape == (4 * 12, 32)  # (H·D, C)
    b = from_hf(saved["attention_bias"]).config
    assert b.attention.biases == (True,) * 4 and b.feed_forward.bias is False
    m = from_hf(saved["mlp_bias"]).config
    assert m.attention.biases == (False,) * 4 and m.feed_forward.bias is True
    assert from_hf(saved["mlp_bias"]).blocks[0].ff.gate_proj.bias is not None


@pytest.mark.parametrize("kind", sorted(LLAMAS))
def test_llama_settings_are_written_back(saved, kind, tmp_path):
    hf = LlamaForCausalLM.from_pretrained(saved[kind])
    again = to_hf(from_hf(saved[kind]))
    assert same_state(hf.state_dict(), again.state_dict())
    for key in ("head_dim", "attention_bias", "mlp_bias"):
        assert getattr(again.config, key) == getattr(hf.config, key), key
    again.save_pretrained(tmp_path)
    assert same_state(from_hf(tmp_path).state_dict(), from_hf(saved[kind]).state_dict())


def test_qkv_sections_llama_cannot_hold_are_refused():
    c = qkv.ModelConfig(vocab_size=64, d_model=32, num_layers=1, max_len=16, position=dict(kind="rope"),
                        normalization=dict(kind="rmsnorm"), feed_forward=dict(activation="swiglu"),
                        attention=dict(num_heads=4, out_bias=False))
    with pytest.raises(ValueError, match=r"LLaMA counterpart .*attention biases \(q, k, v, out\) = "
                                         r"\(True, True, True, False\) differ"):
        hf_config(c)
    with pytest.raises(ValueError, match=r"attention.kind='latent' \(needs 'mha'\)"):
        hf_config(c.replace(attention=dataclasses.replace(c.attention, kind="latent", out_bias=True)))


def test_qkv_sections_gpt2_and_marian_cannot_hold_are_refused():
    c = qkv.ModelConfig(vocab_size=64, d_model=32, num_layers=1, max_len=16, attention=dict(num_heads=4, head_dim=12))
    with pytest.raises(ValueError, match=r"GPT-2 counterpart .*head_dim=12 with 4 heads \(needs d_model / "
                                         r"num_heads = 8 in GPT-2\)"):
        hf_config(c)
    with pytest.raises(ValueError, match=r"no q_bias, ff_bias \(GPT-2 has a bias on every projection\)"):
        hf_config(c.replace(attention=dict(num_heads=4, q_bias=False), feed_forward=dict(bias=False)))
    marian = qkv.ModelConfig.preset("translate", vocab_size=64, d_model=32, num_layers=1,
                                    position=dict(sinusoidal_layout="split"), feed_forward=dict(d_ff=32),
                                    normalization=dict(first=False, final=False),
                                    attention=dict(num_heads=4, v_bias=False))
    with pytest.raises(ValueError, match=r"Marian counterpart .*no v_bias \(Marian has a bias on every projection\)"):
        hf_config(marian, qkv.Transformer)


# --- transformers 4.x spellings beside 5.x ----------------------------------------------------------

def as_4x(config: dict, *, version: str) -> dict:
    """A 5.x LlamaConfig's config.json as transformers ``version`` wrote it."""
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype")}
    old.update(rope_theta=config["rope_parameters"]["rope_theta"], rope_scaling=None, torch_dtype="float32",
               transformers_version=version, pretraining_tp=1)
    minor = int(version.split(".")[1])
    if minor < 45 and config["head_dim"] * config["num_attention_heads"] == config["hidden_size"]:
        del old["head_dim"]  # not a LlamaConfig field before 4.45
    if minor < 41 and not config["mlp_bias"]:
        del old["mlp_bias"]
    return old


@pytest.mark.parametrize("kind, version", [("attention_bias", "4.40.0"), ("head_dim", "4.46.0"),
                                           ("mlp_bias", "4.44.2")])
def test_a_4x_config_json_loads_as_its_5x_spelling(saved, kind, version, tmp_path):
    config = json.loads((saved[kind] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(as_4x(config, version=version)))
    (tmp_path / "model.safetensors").write_bytes((saved[kind] / "model.safetensors").read_bytes())
    old, new = from_hf(tmp_path), from_hf(saved[kind])
    assert old.config == new.config and old.config.position.base == 500.0
    assert same_state(old.state_dict(), new.state_dict())


LLAMA_4_40 = {  # a config.json as transformers 4.40 wrote it for a LLaMA-3-shaped model (widths cut down)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
    "max_position_embeddings": 256, "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0", "use_cache": True, "vocab_size": 128,
}


def test_a_4_40_llama_config_maps_section_by_section():
    problems = []
    c = qkv.ModelConfig.from_dict(llama.config(LLAMA_4_40, problems))
    assert problems == []
    assert (c.vocab_size, c.d_model, c.num_layers, c.max_len) == (128, 64, 2, 256)
    assert c.attention == qkv.models.config.AttentionConfig(num_heads=8, num_kv_heads=2, head_dim=None, q_bias=False,
                                                            k_bias=False, v_bias=False, out_bias=False)
    assert c.position == qkv.models.config.PositionConfig(kind="rope", base=500000.0)
    assert c.feed_forward == qkv.models.config.FeedForwardConfig(d_ff=96, activation="swiglu", bias=False)
    assert (c.normalization.kind, c.normalization.eps, c.normalization.first, c.head.tie) == ("rmsnorm", 1e-5, True,
                                                                                              False)


@pytest.mark.parametrize("hf, base", [
    ({}, 10000.0),  # neither spelling: HF's default
    ({"rope_theta": 5e5, "rope_scaling": None}, 5e5),  # 4.x
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, 5e5),  # 5.x
    ({"rope_parameters": {"rope_type": "default"}, "rope_theta": 5e5}, 5e5),  # 5.x with a 4.x top-level theta
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 2e4}, "rope_theta": 5e5}, 2e4),  # 5.x's wins
    ({"rope_scaling": {"type": "default"}, "rope_theta": 5e5}, 5e5),  # before 4.43: "type"
    ({"rope_scaling": {"rope_type": "default"}, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, 5e5),
    ({"partial_rotary_factor": 1.0, "rope_theta": 3e3}, 3e3),
])
def test_plain_rope_in_either_spelling(hf, base):
    problems = []
    assert plain_rope_base(hf, problems) == base and problems == []


@pytest.mark.parametrize("hf, problem", [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 1e4}, "RoPE scaling 'linear'"),  # 4.x < 4.43
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}, "rope_theta": 5e5}, "RoPE scaling 'llama3'"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "RoPE scaling 'yarn'"),  # 5.x
    ({"partial_rotary_factor": 0.5, "rope_theta": 1e4}, "partial_rotary_factor=0.5"),  # 4.x: top level
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}, "partial_rotary_factor=0.25"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "default"}},
     "disagree"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "the same for every layer"),
    ({"rope_scaling": "linear"}, "rope_scaling='linear' is not supported"),
])
def test_rope_scaling_and_partial_rotation_are_problems_in_either_spelling(hf, problem):
    problems = []
    plain_rope_base(hf, problems)
    assert any(problem in p for p in problems), problems


def test_rope_parameters_gathers_both_spellings_into_5x_form():
    got = rope_parameters({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 5e5,
                           "partial_rotary_factor": 0.5}, [])
    assert got == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5}


def test_a_4x_checkpoint_with_a_rope_type_qkv_lacks_is_refused_in_one_line(saved, tmp_path):
    """(llama3, yarn, … load: tests/test_rope_scaling.py)"""
    config = as_4x(json.loads((saved["attention_bias"] / "config.json").read_text()), version="4.43.0")
    config["rope_scaling"] = {"rope_type": "mystery", "factor": 8.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"^cannot load .* as llama: RoPE scaling 'mystery' is not supported"):
        from_hf(tmp_path)


@pytest.mark.parametrize("family, config", [
    ("gpt2", {"model_type": "gpt2", "n_ctx": 64, "n_positions": 64, "n_embd": 32, "n_layer": 1, "n_head": 4,
              "vocab_size": 50, "activation_function": "gelu_new", "torch_dtype": "float32",
              "transformers_version": "4.40.0"}),
    ("bert", {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
              "intermediate_size": 48, "position_embedding_type": "absolute", "torch_dtype": "float32",
              "transformers_version": "4.40.0"}),
    ("marian", {"model_type": "marian", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 48,
                "decoder_ffn_dim": 48, "vocab_size": 50, "decoder_vocab_size": 50, "activation_function": "swish",
                "torch_dtype": "float32", "transformers_version": "4.40.0"}),
])
def test_4x_configs_of_the_other_families_map_without_problems(family, config):
    problems = []
    qkv.ModelConfig.from_dict(FAMILIES[family].config(config, problems))
    assert problems == []


def test_a_4x_bert_with_relative_positions_is_refused():
    problems = []
    FAMILIES["bert"].config({"position_embedding_type": "relative_key"}, problems)
    assert problems == ["position_embedding_type='relative_key' is not supported (qkv needs 'absolute')"]


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"gemma3", "deepseek_v2", "deepseek_v3"}))
# gemma3: multimodal, refused; DeepSeek's defaults are mixture-of-experts, refused (tests/test_interop_deepseek.py)
def test_each_family_maps_its_hf_default_config(model_type):
    """transformers' own default config of each family is a valid ModelConfig, with no problem."""
    family, problems = FAMILIES[model_type], []
    hf = getattr(transformers, family.hf_classes[0])().to_dict()
    c = qkv.ModelConfig.from_dict(family.config(hf, problems))
    assert problems == [] and isinstance(c, qkv.ModelConfig)


# --- activation names: derived from qkv.nn.layers.ACTIVATIONS ---------------------------------------

def test_activation_names_are_derived_from_the_one_table():
    """Pinned: the hand tables interop/hf.py had before (HF name -> qkv and back), now derived."""
    assert hf_to_qkv(gated=False) == {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                                      "relu": "relu", "silu": "silu", "swish": "silu"}
    assert hf_to_qkv(gated=True) == {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu_tanh",
                                     "gelu_pytorch_tanh": "geglu_tanh"}  # geglu_tanh: Gemma's MLP
    assert qkv_to_hf(gated=False) == {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
    assert qkv_to_hf(gated=True) == {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_new"}
    assert qkv_to_hf(gated=False, prefer=("swish",)) == {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new",
                                                         "silu": "swish"}
    for gated in (False, True):  # every qkv activation has an HF name, and it reads back as itself
        names = qkv_to_hf(gated=gated)
        assert sorted(names) == sorted(n for n, a in ACTIVATIONS.items() if a.gated == gated)
        assert all(hf_to_qkv(gated=gated)[hf] == name for name, hf in names.items())


def test_the_old_table_names_are_still_importable():
    from qkv.interop.hf import ACTIVATIONS as HF_NAMES, GATED, GPT2_ACT_NAME, HF_TASK_MODELS, LLAMA_ACT_NAME

    assert HF_NAMES["gelu_new"] == "gelu_tanh" and GATED["silu"] == "swiglu" and GPT2_ACT_NAME["gelu_tanh"] == "gelu_new"
    assert LLAMA_ACT_NAME == {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_new"}
    assert HF_TASK_MODELS == {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
                              "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
                              "marian": ("MarianConfig", "MarianMTModel"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                              "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                              "mistral": ("MistralConfig", "MistralForCausalLM"),
                              "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
                              "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
                              "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
                              "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
                              "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
                              "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"), "phi3": ("Phi3Config", "Phi3ForCausalLM"),
                              "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
                              "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
                              "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
                              "gpt_oss": ("GptOssConfig", "GptOssForCausalLM")}


# --- the registry: a family is one module and one registration -------------------------------------

def test_a_registered_family_loads_without_editing_the_loader(tmp_path):
    twin = dataclasses.replace(gpt2.FAMILY, model_type="gpt2_twin", name="GPT-2 twin", export=None)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                                                 n_head=2, **NO_SPECIAL))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2_twin"}))
    with pytest.raises(ValueError, match="model_type 'gpt2_twin' is not supported"):
        from_hf(tmp_path)
    register_family(twin)
    try:
        assert same_state(from_hf(tmp_path).state_dict(), from_hf(model).state_dict())
        with pytest.raises(ValueError, match="'gpt2_twin' is already registered"):
            register_family(twin)
    finally:
        FAMILIES.pop("gpt2_twin")
    with pytest.raises(TypeError, match="takes a qkv.interop.hf.Family, got dict"):
        register_family({"model_type": "x"})
    assert isinstance(FAMILIES["gpt2"], Family)
