"""SmolLM3 (NoPE layers), OLMo 2 (norms after the sublayers, QK-norm over the projection) and Phi-3 (fused
projections, partial RoPE, LongRoPE, a window in every layer) through from_hf / to_hf, against HF eager on tiny
random models (tests/hf_models.py DENSE): left-padded logits, greedy tokens = HF generate, exact round trips,
the fast paths refusing them by the setting's name, and one error naming what qkv does not read."""
import json

import pytest
import torch

from qkv import GPT, ModelConfig, cli
from qkv.generation import generate
from qkv.interop.gguf import check_exportable
from qkv.interop.hf import from_hf, to_hf
from qkv.interop.hf.families import phi3
from qkv.kernels import fused_step
from qkv.training.run_dir import load_run

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
from hf_models import DENSE, exported_again, hf_model, left_padded, same_weights, save_with_tokenizer, saved_and_loaded  # noqa: E402
pytestmark = pytest.mark.usefixtures("one_thread")

NO_WINDOW = {"smollm3": dict(use_sliding_window=False), "olmo2": {}, "phi3": dict(sliding_window=None)}
FAST_PATH_REFUSES = {"smollm3": "position.nope_layers=(1, 3)", "olmo2": "attention.qk_norm_scope='projection'",
                     "phi3": "position.rotary_dim=6"}  # the first field the fused step names, windows apart
GGUF_REFUSES = {"smollm3": r"no_rope_layers=\[1, 0, 1, 0\]", "olmo2": r"attention biases on \(llama.cpp's olmo2 has",
                "phi3": None}  # what llama.cpp's architecture lacks (tests/test_gguf_families.py); phi3: nothing


@pytest.fixture(scope="module", params=list(DENSE))
def pair(request, tmp_path_factory):
    hf = hf_model(request.param)
    return request.param, hf, saved_and_loaded(hf, tmp_path_factory.mktemp(request.param))


def test_left_padded_logits_equal_hugging_faces(pair):
    """24 positions: past the window of 6 and past Phi-3's 16 original positions (LongRoPE's long factors)."""
    _, hf, model = pair
    ids, mask = left_padded(24, 7)
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, model(ids, mask=mask.bool()).logits
    keep = mask.bool()
    assert (got[keep] - want[keep]).abs().max() < 1e-4


def test_greedy_tokens_equal_hf_generate_and_cached_equals_uncached(pair):
    _, hf, model = pair
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=24, do_sample=False)
    got = model.generate(ids, 24, temperature=0)
    assert torch.equal(got, want)
    assert torch.equal(model.generate(ids, 24, temperature=0, use_cache=False), got)


def test_greedy_tokens_of_a_left_padded_batch_equal_hf_generate(pair):
    _, hf, model = pair
    ids, mask = left_padded(8, pad=3)
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(ids, 6, temperature=0, mask=mask.bool()), want)


def test_to_hf_round_trip_is_bit_exact_and_loads_with_auto_model(pair, tmp_path):
    family, hf, model = pair
    out, again = exported_again(model, tmp_path)
    assert out.config.model_type == family and same_weights(again, hf)
    ids, mask = left_padded(24, 7)
    with torch.no_grad():
        assert torch.equal(again(ids, attention_mask=mask).logits, hf(ids, attention_mask=mask).logits)
    assert from_hf(tmp_path).config == model.config


@pytest.mark.parametrize("family", list(DENSE))
def test_the_fast_paths_refuse_each_by_the_settings_name_and_inductor_gives_eagers_tokens(family):
    model = from_hf(hf_model(family, **NO_WINDOW[family]))
    assert fused_step.refuses(model, 1).startswith(f"config field {FAST_PATH_REFUSES[family]}")
    if GGUF_REFUSES[family] is None:
        check_exportable(model)  # phi3 without its window: LongRoPE written as rope_factors_short/long
    else:
        with pytest.raises(ValueError, match=GGUF_REFUSES[family]):
            check_exportable(model)
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    want = generate(model, ids, 8, temperature=0, backend="eager")
    assert torch.equal(generate(model, ids, 8, temperature=0, backend="inductor"), want)


def test_smollm3_without_no_rope_layers_makes_every_fourth_layer_nope():
    hf = hf_model("smollm3", num_hidden_layers=8, no_rope_layers=None, use_sliding_window=False)
    model = from_hf(hf)
    assert model.config.position.nope_layers == (3, 7) and model.config.layer_types is None
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4


def test_phi3s_old_longrope_names_read_as_longrope_and_whole_head_rope_is_written_as_mistral():
    rope = dict(DENSE["phi3"][2]["rope_parameters"], partial_rotary_factor=1.0, short_factor=[1.0, 1.5, 2.0, 2.5],
                long_factor=[2.0, 3.0, 4.0, 5.0])
    hf = hf_model("phi3", rope_parameters=rope)
    model = from_hf(hf)
    assert model.config.position.scaling.type == "longrope" and model.config.position.rotary_dim is None
    for old in ("su", "yarn"):  # transformers < 4.42's names (4.x spelling: rope_scaling with "type")
        scaling = {k: v for k, v in rope.items() if k != "rope_type"} | dict(type=old)
        problems = []
        fields = phi3.config({**hf.config.to_dict(), "rope_parameters": None, "rope_scaling": scaling}, problems)
        assert not problems and ModelConfig.from_dict(fields).position == model.config.position
    out = to_hf(model)  # RoPE over whole heads: Mistral holds it (its window, LongRoPE)
    assert out.config.model_type == "mistral"
    ids, mask = left_padded(24, 7)
    with torch.no_grad():
        gap = out(ids, attention_mask=mask).logits - hf(ids, attention_mask=mask).logits
    assert gap[mask.bool()].abs().max() < 1e-4  # the padding's own rows attend to nothing: each library its way


@torch.no_grad()
def test_phi3_with_a_head_dim_apart_from_hidden_over_heads_round_trips(tmp_path):
    """transformers' Phi-3 reads a head_dim where its config has one: D = 12 ≠ 48 / 6, RoPE on 6 of its 12 dims and
    a window, loaded with HF's logits and written back as Phi-3 (no other family rotates part of each head)."""
    hf = hf_model("phi3", head_dim=12, rope_parameters=dict(rope_type="default", rope_theta=500.0,
                                                            partial_rotary_factor=0.5))
    model = saved_and_loaded(hf, tmp_path / "in")
    assert (model.config.head_dim, model.config.position.rotary_dim) == (12, 6)
    out, again = exported_again(model, tmp_path / "out")
    assert out.config.model_type == "phi3" and same_weights(out, hf)
    ids, mask = left_padded(24, 7)
    keep = mask.bool()
    for theirs in (hf, again):
        assert (model(ids, mask=keep).logits[keep] - theirs(ids, attention_mask=mask).logits[keep]).abs().max() < 1e-4


@pytest.mark.parametrize("family, change, message", [
    ("smollm3", dict(no_rope_layers=[1, 2, 1, 0]), "no_rope_layers=[1, 2, 1, 0]"),
    ("smollm3", dict(no_rope_layers=[1, 0]), "a 0 or 1 for each of the 4 layers"),
    ("smollm3", dict(layer_types=["sliding_attention"] * 4, sliding_window=None), "sliding_window=None"),
    ("phi3", dict(rope_parameters=dict(rope_type="dynamic", factor=2.0)),
     "RoPE scaling 'dynamic' is not supported (Phi-3"),
    ("phi3", dict(rope_parameters=dict(rope_type="default", partial_rotary_factor=0.1)), "partial_rotary_factor"),
])
def test_what_qkv_does_not_read_is_one_error_naming_the_setting(family, change, message, tmp_path):
    config = {**DENSE[family][2], "model_type": family, "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 4,
              "num_attention_heads": 6, "num_key_value_heads": 2, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"cannot load {tmp_path} as {family}: .*") as e:
        from_hf(tmp_path)
    assert message in str(e.value)


def test_to_hf_names_what_olmo2_and_phi3_cannot_hold():
    olmo = from_hf(hf_model("olmo2")).config
    no_qk_norm = olmo.replace(attention=dict(olmo.attention.__dict__, qk_norm=False, qk_norm_scope="head"))
    with pytest.raises(ValueError, match="OLMo2 counterpart .*qk_norm_scope='head'"):
        to_hf(GPT(no_qk_norm))
    phi = from_hf(hf_model("phi3")).config
    with pytest.raises(ValueError, match="Phi-3 counterpart .*Phi-3 has none"):
        to_hf(GPT(phi.replace(feed_forward=dict(phi.feed_forward.__dict__, bias=True))))


@pytest.mark.parametrize("family", list(DENSE))
def test_lora_from_hf_then_sample_and_export_on_the_command_line(family, tmp_path, capsys):
    """qkv sample --hf = HF's greedy text; train --init-from-hf --lora, then sample the run and export it: HF loads it
    with the run's logits."""
    hf_dir, run, out, data = tmp_path / "hf", tmp_path / "run", tmp_path / "out", tmp_path / "data.txt"
    hf = save_with_tokenizer(family, hf_dir)
    data.write_text("the dog bites the man and the man bites the dog. " * 200, encoding="utf-8")
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert cli.main(["sample", "--hf", str(hf_dir), "--prompt", "the dog", "--max-new-tokens", "10",
                     "--temperature", "0"]) == 0
    ids = torch.tensor([tok.encode("the dog")])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False, pad_token_id=0,
                       eos_token_id=tok.eos_token_id)
    assert capsys.readouterr().out.rstrip("\n") == tok.decode(want[0])
    assert cli.main(["train", "--init-from-hf", str(hf_dir), "--data", str(data), "--max-steps", "2", "--batch-size",
                     "2", "--context", "16", "--lr", "1", "--quiet", "--device", "cpu", "--sample-tokens", "0",
                     "--lora", "2", "--out", str(run)]) == 0
    assert cli.main(["sample", "--run", str(run), "--prompt", "the dog", "--max-new-tokens", "6",
                     "--temperature", "0"]) == 0
    assert capsys.readouterr().out.count("the dog") >= 1
    assert cli.main(["export", "--run", str(run), "--hf", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    ids = torch.randint(0, len(tok), (1, 20))
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        assert (exported(ids).logits - load_run(run).model.eval()(ids).logits).abs().max() < 1e-4
