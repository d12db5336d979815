"""DeepSeek-V2/V3 (dense layers) through from_hf / to_hf: tiny random Hugging Face models saved with save_pretrained,
against HF eager (right-padded logits, greedy generate through either MLA cache), YaRN's softmax scale, exact round
trips that AutoModelForCausalLM loads where qkv cannot be imported, a 4.x spelling, V3's mixture-of-experts layers
(group-limited sigmoid routing, the correction bias, shared experts), and one clear error for V2's MoE layers and bad
latent widths."""
import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

import qkv
from qkv.interop.hf import FAMILIES, from_hf, to_hf

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors, a core dependency: pip install -e .")
from hf_models import greedy_both, left_padded, padded_logits_gap, saved_and_loaded  # noqa: E402

SIZES = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=6,
             v_head_dim=10, max_position_embeddings=128, first_k_dense_replace=2, n_routed_experts=4,
             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)  # dense; no eos
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32, mscale=0.8,
            mscale_all_dim=1.2)  # mscale ≠ mscale_all_dim: the cos/sin factor and the softmax scale both count
VARIANTS = {  # name -> (HF version, config changes)
    "v3_low_rank_q_interleaved": ("V3", dict(rope_interleave=True)),
    "v3_plain_q_halves": ("V3", dict(q_lora_rank=None, rope_interleave=False)),
    "v3_yarn": ("V3", dict(rope_parameters=YARN)),
    "v2_biases": ("V2", dict(attention_bias=True, mlp_bias=True)),
}


def hf_model(variant: str, **change):
    version, extra = VARIANTS[variant]
    torch.manual_seed(0)
    config = getattr(transformers, f"Deepseek{version}Config")(**{**SIZES, **extra, **change},
                                                               attn_implementation="eager")
    model = getattr(transformers, f"Deepseek{version}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms and biases away from their start
                p.uniform_(0.5, 1.5) if "norm" in name else p.uniform_(-0.5, 0.5)
            else:
                p.mul_(4.0)  # weights larger than the init, so greedy tokens vary
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    hf = hf_model(request.param)
    return request.param, hf, saved_and_loaded(hf, tmp_path_factory.mktemp(request.param))


def with_cache(model: qkv.GPT, mode: str) -> qkv.GPT:
    """The same weights, generating through the ``mode`` latent cache."""
    a = model.config.attention
    other = qkv.GPT(model.config.replace(attention=dataclasses.replace(a, latent_cache=mode))).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_right_padded_logits_equal_hugging_faces(pair):
    variant, hf, model = pair
    assert model.config.attention.kind == "mla"
    assert model.config.position.interleaved == (variant != "v3_plain_q_halves")
    torch.manual_seed(2)
    ids = torch.randint(0, 96, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 14:] = 0  # right padding: row 1 has 14 tokens
    with torch.no_grad():
        want, got = hf(ids, attention_mask=mask).logits, model(ids).logits
    keep = mask.bool()
    err = (got[keep] - want[keep]).abs().max().item()
    assert err < 1e-4, (variant, err)


def test_greedy_tokens_equal_hf_generate_through_the_absorbed_and_the_naive_cache(pair):
    variant, hf, model = pair
    torch.manual_seed(3)
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=32, do_sample=False)
    assert len(set(want[0, 5:].tolist())) > 1, "tokens that never change test nothing"
    assert model.config.attention.latent_cache == "absorbed"
    absorbed = model.generate(ids, 32, temperature=0)
    naive = with_cache(model, "naive").generate(ids, 32, temperature=0)
    assert torch.equal(absorbed, want), variant
    assert torch.equal(naive, absorbed), variant
    assert torch.equal(model.generate(ids, 32, temperature=0, use_cache=False), absorbed), variant


def test_yarn_multiplies_the_softmax_scale_by_mscale_squared_as_hugging_face():
    hf = hf_model("v3_yarn")
    model = from_hf(hf)
    mscale = 0.1 * 1.2 * math.log(4.0) + 1.0  # yarn_get_mscale(factor, mscale_all_dim)
    want = (6 + 8) ** -0.5 * mscale ** 2
    for block, layer in zip(model.blocks, hf.model.layers):
        assert block.attn.softmax_scale == pytest.approx(want, rel=1e-12)
        assert block.attn.softmax_scale == pytest.approx(layer.self_attn.scaling, rel=1e-12)
    plain = qkv.GPT(model.config.replace(position=dataclasses.replace(model.config.position, scaling=None)))
    assert plain.blocks[0].attn.softmax_scale == pytest.approx((6 + 8) ** -0.5)


def test_export_round_trip_is_bit_exact(pair, tmp_path):
    variant, hf, model = pair
    out = to_hf(model)
    assert out.config.model_type == ("deepseek_v2" if variant.startswith("v2") else "deepseek_v3")
    theirs = hf.state_dict()
    assert out.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in out.state_dict().items())
    out.save_pretrained(tmp_path)
    assert from_hf(tmp_path).config == model.config


CHILD = """
import sys
sys.modules["qkv"] = None  # this process cannot import qkv
try:
    import qkv
except ImportError:
    pass
else:
    raise SystemExit("qkv was importable")
import torch, transformers
from safetensors.torch import load_file
for path in sys.argv[1:]:
    want = load_file(path + "/expected.safetensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        got = model(want["ids"]).logits
    assert torch.equal(got, want["logits"]), path
    print(type(model).__name__, model.config.first_k_dense_replace)
"""


def test_auto_model_loads_every_export_in_a_process_without_qkv(tmp_path):
    paths = []
    for variant in VARIANTS:
        hf = hf_model(variant)
        path = tmp_path / variant
        to_hf(from_hf(hf)).save_pretrained(path)
        ids = torch.randint(0, 96, (1, 12))
        with torch.no_grad():
            safetensors_torch.save_file({"ids": ids, "logits": hf(ids).logits}, str(path / "expected.safetensors"))
        paths.append(str(path))
    run = subprocess.run([sys.executable, "-c", CHILD, *paths], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["DeepseekV3ForCausalLM", "2"] * 3 + ["DeepseekV2ForCausalLM", "2"]


def test_a_4x_spelled_yarn_config_loads(tmp_path):
    hf = hf_model("v3_yarn")
    hf.save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    rope = c.pop("rope_parameters")
    theta = rope.pop("rope_theta")
    c |= dict(rope_theta=theta, rope_scaling={"type": rope.pop("rope_type"), **rope}, transformers_version="4.46.0")
    (tmp_path / "config.json").write_text(json.dumps(c))
    model = from_hf(tmp_path)
    assert model.config.position.scaling.mscale_all_dim == 1.2 and model.config.position.base == theta
    ids = torch.randint(0, 96, (2, 20))
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4


def test_v2_mixture_of_experts_problems_in_one_error(tmp_path):
    """An unknown topk_method, top-k > experts, no shared expert and a bad head count: one error, all named."""
    config = transformers.DeepseekV2Config(**{**SIZES, "num_hidden_layers": 4, "first_k_dense_replace": 1},
                                           moe_intermediate_size=8, num_experts_per_tok=2)
    config.save_pretrained(tmp_path)  # the config is refused before any weight is read
    c = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**c, "num_key_value_heads": 2, "topk_method": "noaux_tc",
                                                      "num_experts_per_tok": 5, "n_shared_experts": 0}))
    with pytest.raises(ValueError) as e:
        from_hf(tmp_path)
    message = str(e.value)
    assert message.startswith(f"cannot load {tmp_path} as deepseek_v2: ") and "\n" not in message
    for part in ("topk_method='noaux_tc' (DeepSeek-V2 routes with one of ('greedy', 'group_limited_greedy'))",
                 "n_shared_experts=0 (DeepSeek-V2 has at least one shared expert)",
                 "top_k=5 is larger than num_experts=4", "num_key_value_heads=2 with 4 heads"):
        assert part in message


@pytest.mark.parametrize("model_type, change, problem", [
    ("deepseek_v2", dict(num_hidden_layers=1),  # V2: experts from layer 0, and HF's default top-k is None
     "num_experts_per_tok=None (DeepSeek-V2's mixture-of-experts layers need a top-k; None is DeepseekV2Config's "
     "default)"),
    ("deepseek_v2", dict(num_hidden_layers=5, first_k_dense_replace=5), None),
    ("deepseek_v3", dict(num_hidden_layers=5), None),  # V3: layers 3–4 experts, loaded
    ("deepseek_v3", dict(num_hidden_layers=5, first_k_dense_replace=5), None),
    ("deepseek_v3", dict(num_hidden_layers=5, first_k_dense_replace=0, n_routed_experts=None), None),  # no experts
])
def test_which_layers_are_mixture_of_experts_follows_transformers_defaults(model_type, change, problem):
    hf = {k: v for k, v in SIZES.items() if k not in ("first_k_dense_replace", "n_routed_experts")} | change
    problems = []
    fields = FAMILIES[model_type].config(hf, problems)
    assert problems == ([] if problem is None else [problem])  # V2's: HF's default num_experts_per_tok is None
    if problem is None:
        qkv.ModelConfig.from_dict(fields)


@pytest.mark.parametrize("change, match", [
    (dict(kv_lora_rank=0), r"attention.kv_lora_rank must be a positive int, got 0"),
    (dict(kv_lora_rank=-4), r"attention.kv_lora_rank must be a positive int, got -4"),
    (dict(qk_rope_head_dim=7), r"attention.qk_rope_head_dim must be even \(RoPE rotates pairs\), got 7"),
    (dict(v_head_dim=None), r"attention.v_head_dim must be a positive int, got None"),
])
def test_bad_latent_widths_are_one_clear_error_each(change, match, tmp_path):
    transformers.DeepseekV3Config(**SIZES).save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**c, **change}))
    with pytest.raises(ValueError, match=rf"^cannot load .* as deepseek_v3: {match}$"):
        from_hf(tmp_path)
    attention = dict(kind="mla", num_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=6, v_head_dim=10,
                     q_bias=False, k_bias=False, v_bias=False, out_bias=False) | change
    with pytest.raises(ValueError, match=match):  # the same check where a ModelConfig is built by hand
        qkv.ModelConfig(d_model=48, position=dict(kind="rope"), attention=attention)


def mla_gpt(**feed_forward) -> qkv.GPT:
    attention = dict(kind="mla", num_heads=4, kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=8,
                     qk_nope_head_dim=6, v_head_dim=10, q_bias=False, k_bias=False, v_bias=False, out_bias=False)
    return qkv.GPT(qkv.ModelConfig(vocab_size=96, d_model=48, num_layers=2, max_len=64, attention=attention,
                                   position=dict(kind="rope"), normalization=dict(kind="rmsnorm"),
                                   feed_forward=dict(activation="swiglu", **feed_forward), head=dict(tie=False)))


def test_a_qkv_mla_model_is_written_as_deepseek_v3_or_with_an_mlp_bias_v2():
    plain = mla_gpt(bias=False)  # half-split RoPE: V3's rope_interleave=False
    out = to_hf(plain)
    assert out.config.model_type == "deepseek_v3" and out.config.rope_interleave is False
    ids = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        assert (out(ids).logits - plain(ids).logits).abs().max() < 1e-4
    with pytest.raises(ValueError, match=r"DeepSeek-V2 counterpart .*position.interleaved=False \(DeepSeek-V2 "
                                         r"rotates interleaved pairs"):
        to_hf(mla_gpt(bias=True))


def test_transformers_default_configs_v2_without_top_k_is_refused_v3_loads():
    family, problems = FAMILIES["deepseek_v2"], []
    c = qkv.ModelConfig.from_dict(family.config(transformers.DeepseekV2Config().to_dict(), problems))
    assert c.attention.kind == "mla" and c.attention.q_lora_rank == 1536
    assert problems == ["num_experts_per_tok=None (DeepSeek-V2's mixture-of-experts layers need a top-k; None is "
                        "DeepseekV2Config's default)"]
    c = qkv.ModelConfig.from_dict(FAMILIES["deepseek_v3"].config(transformers.DeepseekV3Config().to_dict(), problems))
    assert len(problems) == 1 and c.attention.q_lora_rank == 1536
    m = c.moe
    assert (m.num_experts, m.top_k, m.score, m.n_group, m.topk_group, m.d_shared, m.routed_scaling_factor) == (
        256, 8, "sigmoid", 8, 4, 2048, 2.5) and m.correction_bias and m.layers == ("dense",) * 3 + ("moe",) * 58


@pytest.mark.parametrize("variant, change", [("v3_low_rank_q_interleaved", {}),
                                             ("v2_biases", dict(mlp_bias=False, num_experts_per_tok=2))])
def test_experts_gated_by_gelu_are_refused_naming_hidden_act(variant, change, tmp_path):
    """transformers' experts and shared experts gate with hidden_act, qkv's with silu: one error naming it (a model
    whose every layer is dense loads: its MLPs take any activation qkv has)."""
    hf = hf_model(variant, **change, hidden_act="gelu", first_k_dense_replace=1)
    with pytest.raises(ValueError, match=r"^cannot load \S+ as deepseek_v[23]: hidden_act='gelu' with "
                                         r"mixture-of-experts layers is not supported \(qkv's experts gate with silu"):
        saved_and_loaded(hf, tmp_path)
    dense = hf_model(variant, **change, hidden_act="gelu")
    assert padded_logits_gap(from_hf(dense), dense) < 1e-4


MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
           moe_intermediate_size=8, n_group=4, topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5)


@torch.no_grad()
def test_v3_mixture_of_experts_layers_as_hf(tmp_path):
    """V3's routing (sigmoid, groups, the correction bias, × 2.5) and shared experts: logits on a left-padded
    batch, greedy tokens, and an exact round trip, from its save_pretrained (per-expert) files."""
    hf = hf_model("v3_low_rank_q_interleaved", **MOE)
    for layer in hf.model.layers[1:]:
        layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    hf.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert model.config.moe.layers == ("dense", "moe", "moe")
    assert padded_logits_gap(model, hf) < 1e-4
    assert torch.equal(*greedy_both(model, hf, left_padded()[0][:1, :8], 12))
    back = to_hf(model).state_dict()
    assert set(back) == set(hf.state_dict()) and all(torch.equal(v, hf.state_dict()[k]) for k, v in back.items())


V2_MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
              moe_intermediate_size=8, n_shared_experts=2, routed_scaling_factor=1.5)


@pytest.mark.parametrize("routing", [dict(topk_method="greedy", mlp_bias=True),
                                     dict(topk_method="group_limited_greedy", n_group=4, topk_group=2)])
@torch.no_grad()
def test_v2_mixture_of_experts_layers_as_hf(routing, tmp_path):
    """V2's routing (softmax, greedy or groups scored by their best expert, unnormalised, × 1.5) and shared
    experts (with mlp_bias's biases, as the dense MLPs): logits on a left-padded batch, greedy tokens, an exact
    round trip, from save_pretrained files."""
    hf = hf_model("v2_biases", **V2_MOE, **({"mlp_bias": False} | routing))
    for layer in hf.model.layers[1:]:
        layer.mlp.gate.weight.normal_(0, 2.0)  # a router that decides: no near-tie for rounding to flip
    model = saved_and_loaded(hf, tmp_path)
    m = model.config.moe
    assert m.layers == ("dense", "moe", "moe") and m.n_group == routing.get("n_group") and not m.norm_topk_prob
    assert m.shared_bias == routing.get("mlp_bias", False)
    assert padded_logits_gap(model, hf) < 1e-4
    ids = left_padded()[0]
    assert torch.equal(*greedy_both(model, hf, ids[:1, :8], 12))
    out = to_hf(model)
    assert out.config.model_type == "deepseek_v2" and out.config.topk_method == routing["topk_method"]
    back = out.state_dict()
    assert set(back) == set(hf.state_dict()) and all(torch.equal(v, hf.state_dict()[k]) for k, v in back.items())
    out.save_pretrained(tmp_path / "back")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    torch.testing.assert_close(again(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_qkv_sample_decodes_a_v2_mixture_of_experts_checkpoint(tmp_path, capsys):
    from hf_models import bpe_tokenizer

    from qkv import cli

    tok = bpe_tokenizer()
    hf = hf_model("v2_biases", **V2_MOE, mlp_bias=False, vocab_size=len(tok), topk_method="group_limited_greedy",
                  n_group=4, topk_group=2)
    tok.save_pretrained(tmp_path)
    hf.save_pretrained(tmp_path)
    assert cli.main(["sample", "--hf", str(tmp_path), "--prompt", "the dog", "--max-new-tokens", "8",
                     "--temperature", "0"]) == 0
    ids = torch.tensor([tok.encode("the dog")])
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                               pad_token_id=0, eos_token_id=tok.eos_token_id)
    assert capsys.readouterr().out.rstrip("\n") == tok.decode(expected[0])
