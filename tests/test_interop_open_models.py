"""Qwen2, Qwen3, Mistral through from_hf / to_hf: tiny random Hugging Face models saved with save_pretrained,
against HF eager (right-padded logits, greedy generate past the window), cached = uncached, exact round trips,
4.x config spellings, the fused step's tokens past the window, and one clear error for what qkv refuses."""
import json

import pytest
import torch

import qkv
from qkv.interop.hf import from_hf, to_hf
from qkv.kernels import fused_step

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from hf_models import FAMILIES, exported_again, hf_model, same_weights  # noqa: E402  (shared with the CLI tests)


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    hf = hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, hf, from_hf(path), path


def test_right_padded_logits_equal_hugging_faces_past_the_window(pair):
    _, hf, model, _ = pair
    ids = torch.randint(0, 96, (2, 20))  # past a window of 6
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 14:] = 0  # right padding: row 1 has 14 tokens
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, model(ids).logits
    keep = mask.bool()
    assert (got[keep] - want[keep]).abs().max() < 1e-4


def test_greedy_tokens_equal_hf_generate_past_the_window_and_cached_equals_uncached(pair):
    _, hf, model, _ = pair
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=32, do_sample=False)
    got = model.generate(ids, 32, temperature=0)
    assert torch.equal(got, want)
    assert torch.equal(model.generate(ids, 32, temperature=0, use_cache=False), got)


def test_export_round_trip_is_bit_exact_and_loads_with_auto_model(pair, tmp_path):
    family, hf, model, _ = pair
    out, again = exported_again(model, tmp_path)
    assert out.config.model_type == family and same_weights(again, hf)
    ids = torch.randint(0, 96, (1, 16))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, hf(ids).logits)
    back = from_hf(tmp_path)
    assert back.config == model.config


@pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where qkv's C++ kernels cannot be built
def test_the_fused_step_decodes_each_family_past_its_window_with_hugging_faces_tokens(pair):
    """Sliding windows (ring caches) and all: backend="fused" takes the model, no fallback; Gemma's own settings
    (query scale, soft caps, (1 + w) norms) are refused by name, not its windows."""
    import warnings

    from qkv.generation import BackendFallback

    family, hf, model, _ = pair
    if family.startswith("gemma"):
        reason = fused_step.refuses(model, 1)
        assert reason.startswith("config field ") and "sliding" not in reason and "layer_types" not in reason
        return
    assert fused_step.refuses(model, 1) is None
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=20, do_sample=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallback)
        assert torch.equal(model.generate(ids, 20, temperature=0, backend="fused"), want)


@pytest.mark.parametrize("family, change, problem", [
    ("qwen2", dict(use_sliding_window=False), None),
    ("mistral", dict(sliding_window=None), None),
    ("qwen3", dict(use_sliding_window=False), None),
])
def test_without_a_window_each_family_is_fully_global_and_still_exports_as_itself(family, change, problem, tmp_path):
    hf = hf_model(family, **change)
    model = from_hf(hf)
    assert model.config.attention.sliding_window is None and model.config.layer_types is None
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4
    written = to_hf(model).config.model_type  # Mistral without a window is LLaMA's model: written as llama
    assert written == {"mistral": "llama"}.get(family, family)


def test_a_4x_spelled_config_loads(tmp_path):
    hf = hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    theta = c.pop("rope_parameters")["rope_theta"]
    c.pop("layer_types")
    c |= dict(rope_theta=theta, rope_scaling=None, transformers_version="4.45.0")
    (tmp_path / "config.json").write_text(json.dumps(c))
    model = from_hf(tmp_path)
    assert model.config.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    ids = torch.randint(0, 96, (1, 20))
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4


def test_what_qkv_cannot_express_is_one_error_listing_every_problem(tmp_path):
    hf = hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    c |= dict(num_experts=8, layer_types=["full_attention"], rope_parameters={"rope_type": "magic", "rope_theta": 1e4})
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError) as e:
        from_hf(tmp_path)
    message = str(e.value)
    assert message.startswith("cannot load") and "\n" not in message
    for part in ("num_experts=8 is not supported", "RoPE scaling 'magic'", "expected a list of 3 layer types"):
        assert part in message


def test_a_model_that_fits_no_open_family_is_refused_naming_what_differs():
    config = qkv.ModelConfig(vocab_size=96, d_model=48, num_layers=2, max_len=64, position=dict(kind="rope"),
                             feed_forward=dict(activation="swiglu"), normalization=dict(kind="rmsnorm"),
                             attention=dict(num_heads=6, qk_norm=True, q_bias=True, k_bias=True,
                                                                 v_bias=True, out_bias=False))
    with pytest.raises(ValueError, match=r"Qwen3 counterpart .*attention biases \(q, k, v, out\) = \(True, True, True, "
                                         r"False\) differ"):
        to_hf(qkv.GPT(config))


@pytest.mark.parametrize("pair", ["gemma2"], indirect=True)
def test_gemma2_soft_caps_bend_its_logits_and_it_exports_as_gemma2(pair):
    family, hf, model, _ = pair
    ids = torch.randint(0, 96, (1, 20))
    a = model.config.attention
    with torch.no_grad():
        got = model(ids).logits
        for change in (dict(head=dict(softcap=None)), dict(attention=type(a)(**{**a.__dict__, "softcap": None}))):
            uncapped = qkv.GPT(model.config.replace(**change)).eval()
            uncapped.load_state_dict(model.state_dict())
            assert (uncapped(ids).logits - got).abs().max() > 0.1, change
    assert model.config.layer_types[:2] == ("sliding_attention", "full_attention") and model.config.head.tie


def test_a_4x_gemma2_config_without_layer_types_alternates_sliding_first(tmp_path):
    hf = hf_model("gemma2")
    hf.save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    c.pop("layer_types")
    c |= dict(rope_theta=c.pop("rope_parameters")["rope_theta"], transformers_version="4.45.0")
    (tmp_path / "config.json").write_text(json.dumps(c))
    model = from_hf(tmp_path)
    assert model.config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    ids = torch.randint(0, 96, (1, 20))
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4
