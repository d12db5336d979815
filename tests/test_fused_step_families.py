"""The fused decode step on today's open families' shapes — Qwen2 (q/k/v biases), Qwen3 (QK-norm), Llama 3.x
and YaRN (scaled RoPE), Mistral and Qwen2 with sliding windows (ring caches that wrap) — against the model's own forward: logits, KV caches and greedy tokens; and what it
still refuses, each by the field's name, decoded the reference way."""
import importlib
import re
import warnings

import pytest
import torch

import qkv
from qkv.generation import BackendFallback, generate
from qkv.generation.backends import last_logits
from qkv.generation.decode import StaticCache
from qkv.kernels import fused_step
from qkv.models import AttentionConfig

built = pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where they cannot be built

LLAMA3 = dict(type="llama3", factor=8.0, original_max_position_embeddings=16, low_freq_factor=1.0,
              high_freq_factor=4.0)


def config(attention: dict | None = None, position: dict | None = None, **overrides) -> qkv.ModelConfig:
    """A Qwen2-shaped decoder at test size: RoPE (base 10⁶), RMSNorm (eps 10⁻⁶), SwiGLU without biases, an untied
    head, 6 query heads over 2 key/value heads (GQA ratio 3) of width 16 ≠ d_model / heads = 8, q/k/v biased."""
    sections = dict(
        attention=dict(num_heads=6, num_kv_heads=2, head_dim=16, out_bias=False) | (attention or {}),
        position=dict(kind="rope", base=1e6) | (position or {}),
        feed_forward=dict(d_ff=96, activation="swiglu", bias=False),
        normalization=dict(kind="rmsnorm", eps=1e-6), head=dict(tie=False))
    return qkv.ModelConfig(vocab_size=96, d_model=48, num_layers=2, max_len=64, **(sections | overrides))


FAMILIES = {
    "qwen2": config(),
    "qwen3 (qk-norm, no biases)": config(dict(qk_norm=True, q_bias=False, k_bias=False, v_bias=False)),
    "qk-norm as layernorm": config(dict(qk_norm=True), normalization=dict(kind="layernorm", eps=1e-5)),
    "llama 3.1 (llama3 rope)": config(dict(q_bias=False, k_bias=False, v_bias=False), dict(scaling=LLAMA3)),
    "yarn, interleaved": config(position=dict(interleaved=True, scaling=dict(
        type="yarn", factor=4.0, original_max_position_embeddings=16))),
    "linear rope, qk-norm": config(dict(qk_norm=True), dict(scaling=dict(type="linear", factor=2.0))),
    "mistral (every layer sliding, window 5)": config(dict(sliding_window=5, q_bias=False, k_bias=False,
                                                           v_bias=False)),
    "qwen2 with windows (window 4, then full)": config(dict(sliding_window=4),
                                                       layer_types=("sliding_attention", "full_attention")),
    "window 1": config(dict(sliding_window=1)),
}


def model_of(config: qkv.ModelConfig, seed: int = 0) -> qkv.GPT:
    torch.manual_seed(seed)
    model = qkv.GPT(config).eval()
    with torch.no_grad():  # biases and norm weights away from their init (0 and 1), so a dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def prompt(batch: int, length: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T) and valid (B, T): row 0 of a batch > 1 left-padded by 3."""
    ids = torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))
    valid = torch.ones(batch, length, dtype=torch.bool)
    if batch > 1:
        valid[0, :3] = False
    return ids, valid


@built
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fused_step_accepts_the_family(family):
    assert fused_step.refuses(model_of(FAMILIES[family]), 1) is None


@built
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", [1, 3])
def test_logits_and_caches_equal_the_model_step_by_step(family, batch):
    """Twenty steps after a prompt (a left-padded row at batch 3): the fused step's logits equal the model's
    cached step and its forward over the whole sequence without a cache (≤ 1e-4), and its KV caches the model's."""
    model = model_of(FAMILIES[family])
    ids, valid = prompt(batch)
    caches = [StaticCache(model, batch, 32, device="cpu") for _ in range(2)]
    ref, fused = caches
    logits = [c.prefill(ids, valid) for c in caches][0]
    step, reference = fused_step.FusedStep(model), last_logits(model)
    with torch.no_grad():
        for slot in range(7, 27):
            tok = logits.argmax(-1)[:, None]  # (B, 1)
            ids, valid = torch.cat([ids, tok], 1), torch.cat([valid, torch.ones_like(tok, dtype=torch.bool)], 1)
            for cache in caches:
                cache.slots[:, slot] = True
            input_pos = ref.slot_ids[slot:slot + 1]
            logits = reference(tok, ref.slots, ref.layers, input_pos)
            got = step(tok, fused.slots, fused.layers, input_pos)
            whole = model(ids, mask=valid).logits[:, -1]  # no cache at all
            torch.testing.assert_close(got, logits, atol=1e-4, rtol=0)
            torch.testing.assert_close(got, whole, atol=1e-4, rtol=0)
            for a, b in zip(ref.layers, fused.layers):
                torch.testing.assert_close(b.k, a.k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(b.v, a.v, atol=1e-5, rtol=1e-5)


@built
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_the_references_over_40_tokens(family):
    """generate(backend="fused") runs the fused step (no fallback) and gives the tokens of the eager backend and
    of decoding without a cache, 40 greedy tokens, batch 1 and a left-padded batch of 3."""
    model = model_of(FAMILIES[family])
    for batch in (1, 3):
        ids, valid = prompt(batch, seed=batch)
        want = generate(model, ids, 40, temperature=0, mask=valid, backend="eager")
        assert torch.equal(generate(model, ids, 40, temperature=0, mask=valid, use_cache=False), want)
        with warnings.catch_warnings():
            warnings.simplefilter("error", BackendFallback)
            assert torch.equal(generate(model, ids, 40, temperature=0, mask=valid, backend="fused"), want)


@built
@pytest.mark.parametrize("family", ["llama 3.1 (llama3 rope)", "yarn, interleaved", "linear rope, qk-norm"])
def test_a_scaled_rope_table_is_the_modules_own(family):
    """The step's cos and sin are the model's RotaryEmbedding's at every slot: its scaled θ, and YaRN's
    attention factor (at position 0, cos = the factor) — not plain RoPE's."""
    model = model_of(FAMILIES[family])
    rope = model.blocks[0].attn.rope
    table = fused_step.FusedStep(model).rope_table(32)  # (2, M, D/2)
    torch.testing.assert_close(table, torch.stack(rope.angles(torch.arange(32))), atol=0, rtol=0)
    plain = qkv.RotaryEmbedding(rope.head_dim, rope.base).angles(torch.arange(32))
    assert not torch.allclose(table[0], plain[0])
    assert torch.allclose(table[0, 0], torch.full_like(table[0, 0], rope.attention_factor))


LENGTH_DEPENDENT = {
    "dynamic": dict(type="dynamic", factor=2.0, original_max_position_embeddings=16),
    "longrope": dict(type="longrope", factor=4.0, original_max_position_embeddings=16, short_factor=[1.0] * 8,
                     long_factor=[2.0] * 8),
}


@pytest.fixture
def eager_compile(monkeypatch):
    """The fallback (inductor's step) captured by dynamo without code generation: seconds, not minutes."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()


def falls_back_to_the_reference(model, reason: str, new: int = 12) -> None:
    """backend="fused" warns once, naming ``reason``, and gives the eager tokens (its fallback's)."""
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    want = generate(model, ids, new, temperature=0, backend="eager")
    with pytest.warns(BackendFallback, match=re.escape(reason)) as said:
        assert torch.equal(generate(model, ids, new, temperature=0, backend="fused"), want)
    assert len(said) == 1


@built
@pytest.mark.parametrize("scaling", LENGTH_DEPENDENT)
def test_rope_whose_table_follows_the_length_is_refused(scaling, eager_compile):
    """dynamic NTK and longrope change θ with the current length: one table for every slot would be wrong."""
    model = model_of(config(position=dict(scaling=LENGTH_DEPENDENT[scaling])))
    reason = fused_step.refuses(model, 1)
    assert reason.startswith(f"config field position.scaling=RopeScaling(type={scaling!r}")
    assert "'dynamic' and 'longrope', whose θ follow the current length" in reason
    falls_back_to_the_reference(model, "config field position.scaling=")


@built
def test_a_length_dependent_scaling_set_on_the_module_is_refused():
    """The config says plain RoPE but the model's RotaryEmbedding was given dynamic scaling by hand."""
    model = model_of(config())
    model.blocks[0].attn.rope.scaling = qkv.nn.rope_scaling.RopeScaling(**LENGTH_DEPENDENT["dynamic"])
    assert fused_step.refuses(model, 1) == (
        "its RotaryEmbedding's dynamic scaling follows the current length (its table is not fixed)")


MLA = dict(kind="mla", num_kv_heads=None, head_dim=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=12, q_bias=False, k_bias=False, v_bias=False, out_bias=False)
SLIDING = dict(sliding_window=8)  # past 8 tokens the ring cache wraps
REFUSED = {  # the config, and the field its reason names
    "attention soft cap": (config(dict(softcap=20.0)), "attention.softcap=20.0"),
    "logit soft cap": (config(head=dict(tie=False, softcap=10.0)), "head.softcap=10.0"),
    "query scalar": (config(dict(query_scalar=24.0)), "attention.query_scalar=24.0"),
    "sandwich norms": (config(normalization=dict(kind="rmsnorm", eps=1e-6, sandwich=True)),
                       "normalization.sandwich=True"),
    "rmsnorm plus one": (config(normalization=dict(kind="rmsnorm_plus_one", eps=1e-6)),
                         "normalization.kind='rmsnorm_plus_one'"),
    "qk-norm plus one": (config(dict(qk_norm=True), normalization=dict(kind="rmsnorm_plus_one", eps=1e-6)),
                         "normalization.kind='rmsnorm_plus_one'"),
    "multi-head latent attention": (config(MLA), "attention.kind='mla'"),
    "partial rotary": (config(position=dict(rotary_dim=8)), "position.rotary_dim=8"),
    "local rope base": (config(SLIDING, dict(local_base=1e4), layer_types=("sliding_attention", "full_attention")),
                        "position.local_base=10000.0"),
}


@built
@pytest.mark.parametrize("name", REFUSED)
def test_what_it_still_refuses_names_the_field_and_decodes_the_reference_way(name, eager_compile):
    """unsupported names the field; backend="auto" gives the eager tokens."""
    model_config, field = REFUSED[name]
    model = model_of(model_config)
    reason = fused_step.refuses(model, 1)
    assert reason is not None and reason.startswith(f"config field {field}"), reason
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    want = generate(model, ids, 12, temperature=0, backend="eager")
    assert torch.equal(generate(model, ids, 12, temperature=0, backend="auto"), want)


@built
@pytest.mark.parametrize("name", REFUSED)
def test_what_it_still_refuses_falls_back_with_one_warning_to_the_reference_tokens(name, eager_compile):
    """backend="fused" warns once, naming the field, and its fallback (inductor's step) gives the eager tokens
    (past a sliding window of 8 too: 5 + 12 tokens)."""
    model_config, field = REFUSED[name]
    falls_back_to_the_reference(model_of(model_config), field)


@built
def test_qk_norm_the_config_lacks_is_refused_by_the_module_check():
    """QK-norm's modules set by hand on a model whose config has none (or removed from one that has)."""
    model = model_of(config())
    model.blocks[1].attn.q_norm = torch.nn.RMSNorm(16, eps=1e-6)
    model.blocks[1].attn.k_norm = torch.nn.RMSNorm(16, eps=1e-6)
    assert fused_step.refuses(model, 1) == (
        "blocks.1.attn: attention with QK-norm, a scale or a soft cap (it computes softmax(q·k/√D) v)")
    model = model_of(FAMILIES["qwen3 (qk-norm, no biases)"])
    model.blocks[0].attn.k_norm = None
    assert fused_step.refuses(model, 1) == (
        "blocks.0.attn: attention with QK-norm, a scale or a soft cap (it computes softmax(QKNorm(q)·QKNorm(k)/√D) v)")
    model = model_of(FAMILIES["qwen3 (qk-norm, no biases)"])
    model.blocks[0].attn.q_norm.eps = 1e-3
    assert fused_step.refuses(model, 1) == "blocks.0.attn.q_norm has eps 0.001 where the config says 1e-06"
