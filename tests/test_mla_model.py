"""Multi-head latent attention as an attention kind of qkv.GPT (attention.kind = "mla"): the config, the
factory, the model's caches (absorbed and naive give one answer), the speed layer, the CLI, the exports."""
import json

import pytest
import torch

import qkv
from qkv import GPT, ModelConfig
from qkv.cli import main
from qkv.interop.hf.families import FAMILIES
from qkv.kernels import fused_step
from qkv.nn.latent_attention import DecompressedKVCache, LatentCache

MLA = dict(kind="mla", num_heads=4, kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=6,
           v_head_dim=10, q_bias=False, k_bias=False, v_bias=False, out_bias=False)


def config(**attention) -> ModelConfig:
    return ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=64, position=dict(kind="rope"),
                       normalization=dict(kind="rmsnorm"), feed_forward=dict(activation="swiglu", bias=False),
                       attention={**MLA, **attention})


def model(seed=0, **attention) -> GPT:
    torch.manual_seed(seed)
    m = GPT(config(**attention)).eval()
    with torch.no_grad():  # weights larger than GPT-2's init, so greedy tokens vary
        for name, p in m.named_parameters():
            if p.dim() >= 2 and "embed" not in name:
                p.mul_(4.0)
    return m


def padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = mask[2, :5] = False  # left padding
    return ids, mask


def test_config_round_trips_readably_and_old_configs_stay_as_they_were():
    c = config(latent_cache="naive")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["attention"]["kind"] == "mla" and d["attention"]["kv_lora_rank"] == 16
    assert d["attention"]["latent_cache"] == "naive" and ModelConfig.from_dict(d) == c
    assert "kv_lora_rank" not in ModelConfig().to_dict()["attention"]  # an mha config.json is as before
    assert config(q_lora_rank=None).attention.q_lora_rank is None


@pytest.mark.parametrize("change, match", [
    (dict(kv_lora_rank=None), r"attention.kv_lora_rank must be a positive int"),
    (dict(v_head_dim=0), r"attention.v_head_dim must be a positive int"),
    (dict(qk_rope_head_dim=7), r"qk_rope_head_dim must be even"),
    (dict(num_kv_heads=2), r"num_kv_heads must be None or num_heads \(4\), got 2"),
    (dict(head_dim=8), r"takes no head_dim"),
    (dict(latent_cache="compressed"), r"latent_cache must be one of \('absorbed', 'naive'\)"),
    (dict(q_bias=True), r"q/k/v/out_bias must agree, got \(True, False, False, False\)"),
    (dict(kind="mha"), r"attention fields \[.*'kv_lora_rank'.*\] belong to kind 'mla', got kind 'mha'"),
])
def test_bad_attention_sections_say_what_was_expected(change, match):
    with pytest.raises(ValueError, match=match):
        config(**change)


def test_mla_needs_rope():
    with pytest.raises(ValueError, match=r"needs position.kind 'rope'.*got kind 'learned'"):
        config().replace(position=dict(kind="learned"))
    yarn = config().replace(position=dict(kind="rope", scaling=dict(type="yarn", factor=2.0,  # DeepSeek's mscale²:
                                                                    original_max_position_embeddings=32)))
    assert yarn.position.scaling.type == "yarn"  # tests/test_interop_deepseek.py
    with pytest.raises(ValueError, match=r"latent_cache.*belong to kind 'mla'"):
        ModelConfig(attention=dict(latent_cache="naive"))


def test_the_factory_builds_latent_attention_with_one_shared_rope():
    m = model()
    attns = [b.attn for b in m.blocks]
    assert all(isinstance(a, qkv.MultiHeadLatentAttention) for a in attns)
    assert attns[0].rope is attns[1].rope and attns[0].rope.head_dim == 8
    assert qkv.nn.MultiHeadLatentAttention is qkv.MultiHeadLatentAttention
    std = GPT(config()).blocks[0].attn.o_proj.weight.std().item()  # residual scaling 0.02 / √(2·layers)
    assert std == pytest.approx(0.02 / 2, rel=0.2)


def test_forward_and_cached_equals_uncached_logits():
    m, (ids, mask) = model(), padded_batch()
    full = m(ids, mask=mask).logits  # (B, T, V)
    assert full.shape == (3, 7, 64)
    for mode in ("absorbed", "naive"):
        m.config = m.config.replace(attention={**MLA, "latent_cache": mode})
        caches = m.new_kv_caches(3, 16)
        kind = LatentCache if mode == "absorbed" else DecompressedKVCache
        assert all(type(c) is kind for c in caches)
        first = m(ids[:, :4], mask=mask[:, :4], kv_caches=caches).logits
        rest = [m(ids[:, t:t + 1], mask=mask[:, :t + 1], kv_caches=caches).logits for t in range(4, 7)]
        diff = (torch.cat([first, *rest], 1) - full)[mask].abs().max().item()
        assert diff < 1e-4, (mode, diff)


def test_naive_and_absorbed_give_the_same_greedy_tokens_cached_or_not():
    ids, mask = padded_batch()
    outs = {}
    for mode in ("absorbed", "naive"):
        m = model(latent_cache=mode)
        for use_cache in (True, False):
            outs[mode, use_cache] = m.generate(ids, 16, temperature=0, mask=mask, use_cache=use_cache,
                                               backend="eager")
    first = outs["absorbed", True]
    assert first.shape == (3, 23) and len(set(first[0, 7:].tolist())) > 1
    assert all(torch.equal(o, first) for o in outs.values())


def test_the_latent_caches_hold_d_c_plus_d_r_numbers_per_token_and_layer():
    m, tokens = model(), 24
    caches = m.new_kv_caches(1, tokens)
    assert sum(c.nbytes for c in caches) == (16 + 8) * 2 * tokens * 4
    m.config = m.config.replace(attention={**MLA, "latent_cache": "naive"})
    assert sum(c.nbytes for c in m.new_kv_caches(1, tokens)) == 4 * (14 + 10) * 2 * tokens * 4


def test_the_speed_layer_keeps_the_tokens_and_the_fused_step_refuses_with_a_reason():
    m, (ids, mask) = model(), padded_batch()
    eager = m.generate(ids, 12, temperature=0, mask=mask, backend="eager")
    assert torch.equal(m.generate(ids, 12, temperature=0, mask=mask, backend="auto"), eager)
    reason = fused_step.refuses(m, 1)
    assert reason is not None and "attention.kind='mla'" in reason
    with pytest.raises(ValueError, match=r"fused decode step cannot run this model: .*attention.kind='mla'"):
        fused_step.FusedStep(m)


def test_the_compiled_step_decodes_the_absorbed_cache_with_the_eager_tokens():
    m, (ids, mask) = model(), padded_batch()
    assert isinstance(m.new_kv_caches(3, 8)[0], LatentCache)
    with torch.inference_mode():
        eager = m.generate(ids, 12, temperature=0, mask=mask, backend="eager")
        assert torch.equal(m.generate(ids, 12, temperature=0, mask=mask, backend="inductor"), eager)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
def test_the_plain_families_refuse_to_export_mla(family):
    problems = []
    FAMILIES[family].export(config(), problems)
    assert any("attention.kind='mla' (needs 'mha')" in p for p in problems), problems


def test_cli_trains_an_mla_gpt_and_plots_its_heads(data, tmp_path):
    out = tmp_path / "r"
    flags = [f"--model=attention.{k}={'none' if v is None else str(v).lower()}" for k, v in MLA.items()]
    torch.set_num_threads(1)
    assert main(["train", "--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-interval", "2",
                 "--quiet", "--device", "cpu", "--positional", "rope", *flags, "--data", str(data),
                 "--max-steps", "3", "--out", str(out), "--sample-tokens", "0"]) == 0
    saved = ModelConfig.from_dict(json.loads((out / "config.json").read_text()))
    assert saved.attention.kind == "mla" and saved.attention.kv_lora_rank == 16
    assert main(["plot", "attention", "--run", str(out), "--text", "def f(x):", "--out", str(tmp_path)]) == 0
    assert main(["explore", "--run", str(out), "--text", "def f(x):", "--out", str(tmp_path / "e.html")]) == 0
    assert (tmp_path / "e.html").stat().st_size > 0
