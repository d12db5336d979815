"""Gemma 3's text model (gemma3_text) through from_hf / to_hf: tiny random Gemma3ForCausalLM models saved with
save_pretrained, against HF eager (right-padded logits past the window, RoPE scaling on the global layer only,
greedy generate), cached = uncached, an exact round trip that transformers loads without qkv, the 4.x spelling,
and one clear error for what qkv refuses (the multimodal config among it)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import qkv
from qkv.interop.hf import from_hf, to_hf
from qkv.interop.hf.families.gemma3 import FAMILY

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=128, sliding_window=8,
             query_pre_attn_scalar=24, bos_token_id=None, eos_token_id=None, pad_token_id=None)
# GQA 2, D = 32 ≠ C/H = 16; 7 layers: sliding 0-4 and 6, global 5; no eos, so generate makes all 32 tokens
LINEAR = dict(rope_scaling={"rope_type": "linear", "factor": 8.0})  # as the 4B+ checkpoints: global layers only
LOAD_WITHOUT_QKV = """
import json, sys
sys.modules["qkv"] = None  # qkv cannot be imported: what transformers loads stands alone
import torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="eager").eval()
with torch.no_grad():
    logits = model(torch.tensor([json.loads(sys.argv[2])])).logits[0]
print(json.dumps({"class": type(model).__name__, "logits": logits.tolist()}))
"""


def hf_model(**change):
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{**SIZES, **change}, attn_implementation="eager")
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # every norm (q/k norms too) away from its zero start
                p.uniform_(-0.5, 0.5)
    return model


@pytest.fixture(scope="module", params=["plain", "linear"])
def pair(request, tmp_path_factory):
    hf = hf_model(**(LINEAR if request.param == "linear" else {}))
    path = tmp_path_factory.mktemp(f"gemma3_{request.param}")
    hf.save_pretrained(path)
    return hf, from_hf(path), path


def max_error(model, hf, ids, mask=None) -> float:
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, model(ids).logits
    keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    return (got[keep] - want[keep]).abs().max().item()


def test_it_reads_as_gemma3(pair):
    hf, model, _ = pair
    c = model.config
    assert c.layer_types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    assert c.attention.qk_norm and c.attention.sliding_window == 8 and c.attention.query_scalar == 24
    assert (c.position.base, c.position.local_base) == (1e6, 1e4) and c.normalization.kind == "rmsnorm_plus_one"
    assert c.head.tie and c.head.softcap is None and c.attention.softcap is None
    assert (c.position.scaling is not None) == (hf.config.rope_parameters["full_attention"]["rope_type"] == "linear")


def test_right_padded_logits_equal_hugging_faces_past_the_window(pair):
    hf, model, _ = pair
    ids = torch.randint(0, 96, (2, 40))  # past a window of 8, past 128 / 8 = 16 scaled positions
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 27:] = 0  # right padding: row 1 has 27 tokens
    assert max_error(model, hf, ids, mask) < 1e-4


def test_greedy_tokens_equal_hf_generate_past_the_window_and_cached_equals_uncached(pair):
    hf, model, _ = pair
    prompt = torch.randint(0, 96, (1, 12))  # the prefill already past the window of 8, the 32 tokens far past it
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=32, do_sample=False)
    got = model.generate(prompt, 32, temperature=0)
    assert got.shape == (1, 44) and torch.equal(got, want)
    assert torch.equal(model.generate(prompt, 32, temperature=0, use_cache=False), got)


def test_linear_scaling_applies_to_the_global_layer_alone(tmp_path):
    """θ the same on both layer types, so only the scaling tells them apart: qkv must scale layer 5 and only it."""
    hf = hf_model(**LINEAR, rope_local_base_freq=1e6)
    model = from_hf(hf)
    ids = torch.randint(0, 96, (1, 64))  # positions to 63, past 128 / 8
    assert max_error(model, hf, ids) < 1e-4
    p = model.config.position
    for wrong in (dict(scaling=None), dict(local_base=None)):  # unscaled, or the sliding layers scaled too
        other = qkv.GPT(model.config.replace(position=type(p)(**{**p.__dict__, **wrong}))).eval()
        other.load_state_dict(model.state_dict())
        assert max_error(other, hf, ids) > 1e-3, wrong


def hf_load_without_qkv(path, ids: list[int]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_QKV, str(path), json.dumps(ids)], capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_export_round_trip_is_bit_exact_and_loads_with_auto_model_without_qkv(pair, tmp_path):
    hf, model, _ = pair
    out = to_hf(model)
    assert out.config.model_type == "gemma3_text"
    out.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    theirs = hf.state_dict()
    assert again.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in again.state_dict().items())
    assert again.config.rope_parameters == hf.config.rope_parameters
    ids = torch.randint(0, 96, (1, 24))
    loaded = hf_load_without_qkv(tmp_path, ids[0].tolist())
    with torch.no_grad():
        assert torch.equal(torch.tensor(loaded["logits"]), hf(ids).logits[0])
    assert loaded["class"] == "Gemma3ForCausalLM"
    assert from_hf(tmp_path).config == model.config


@pytest.mark.parametrize("pattern", [6, 3])
def test_a_4x_spelled_config_loads_as_transformers_reads_it(pattern, tmp_path):
    hf = hf_model(**LINEAR)
    hf.save_pretrained(tmp_path)
    new = from_hf(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    rope = c.pop("rope_parameters")
    c.pop("layer_types"), c.pop("_sliding_window_pattern", None)
    c |= dict(rope_theta=rope["full_attention"]["rope_theta"], rope_local_base_freq=rope["sliding_attention"]
              ["rope_theta"], rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window_pattern=pattern,
              transformers_version="4.50.0")
    (tmp_path / "config.json").write_text(json.dumps(c))
    model = from_hf(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert theirs.config.layer_types == list(model.config.layer_types)
    assert (model.config == new.config) == (pattern == 6)  # 3: globals at 2 and 5
    assert max_error(model, theirs, torch.randint(0, 96, (1, 40))) < 1e-4


def test_the_multimodal_config_is_refused_by_name_with_its_text_configs_problems(tmp_path):
    text = transformers.Gemma3TextConfig(**SIZES, use_bidirectional_attention=True).to_dict()
    c = transformers.Gemma3Config(text_config=text).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError) as e:
        from_hf(tmp_path)
    message = str(e.value)
    assert message.startswith("cannot load") and "\n" not in message
    assert "Gemma 3's multimodal config (model_type 'gemma3' with vision_config 'siglip_vision_model'" in message
    assert "load the text model (gemma3_text" in message and "use_bidirectional_attention=True" in message


def test_what_qkv_cannot_express_is_one_error_listing_every_problem(tmp_path):
    hf_model().save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    c["rope_parameters"]["sliding_attention"] |= dict(rope_type="linear", factor=2.0)
    c |= dict(use_bidirectional_attention=True, attn_logit_softcapping=50.0, layer_types=["full_attention"])
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError) as e:
        from_hf(tmp_path)
    message = str(e.value)
    assert message.startswith("cannot load") and "\n" not in message
    for part in ("use_bidirectional_attention=True", "attn_logit_softcapping=50.0",
                 "RoPE scaling 'linear' on sliding_attention layers", "expected a list of 7 layer types"):
        assert part in message, part


def test_export_refuses_scaling_that_would_reach_the_sliding_layers():
    model = from_hf(hf_model(**LINEAR))
    p = model.config.position
    shared = model.config.replace(position=type(p)(**{**p.__dict__, "local_base": None}))  # one RoPE, scaled
    with pytest.raises(ValueError, match=r"Gemma3 counterpart .*position.scaling on sliding layers"):
        to_hf(qkv.GPT(shared))
    plain = shared.replace(position=type(p)(**{**p.__dict__, "local_base": None, "scaling": None}))
    assert to_hf(qkv.GPT(plain)).config.rope_parameters["sliding_attention"]["rope_theta"] == 1e6  # θ shared


@pytest.mark.parametrize("change, problem", [
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
     "expected one object per layer type: full_attention, sliding_attention"),
    (dict(sliding_window_pattern=0), "sliding_window_pattern=0 (expected a positive int)"),
    (dict(rope_scaling={"rope_type": "magic"}), "RoPE scaling 'magic' is not supported"),
])
def test_a_misspelled_rope_or_pattern_is_one_problem(change, problem):
    problems = []
    FAMILY.config({**SIZES, **change}, problems)
    assert problems == [next(p for p in problems if problem in p)]
