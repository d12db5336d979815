"""The attention and norm variants of today's open models (Qwen3, Mistral, Gemma 2/3): QK-norm, the sliding
window and its ring-buffer KV cache, soft-capping, the query scale, Gemma's (1 + w) RMSNorm and four norms per
block, √d_model embeddings in the weights' dtype. Each against its formula written out here, against
Hugging Face's module where one exists (weights copied), cached against uncached inside qkv.GPT, and its errors."""
import json
import math

import pytest
import torch

import qkv
from qkv.kernels import fused_step
from qkv.models import AttentionConfig, ModelConfig
from qkv.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from qkv.nn.block import SandwichTransformerBlock
from qkv.nn.kv_cache import KVCache, RingKVCache
from qkv.nn.layers import RMSNormPlusOne, soft_cap
from qkv.nn.masks import causal_mask, sliding_window_mask

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def gemma_like(**overrides) -> ModelConfig:
    """A tiny Gemma-2-shaped config: alternating sliding/global layers, every variant on."""
    kw = dict(vocab_size=64, d_model=32, num_layers=4, max_len=48,
              layer_types=["sliding_attention", "full_attention"] * 2,
              attention=dict(num_heads=4, num_kv_heads=2, head_dim=16, q_bias=False, k_bias=False, v_bias=False,
                             out_bias=False, query_scalar=12.0, softcap=5.0, sliding_window=6),
              position=dict(kind="rope", base=10000.0),
              feed_forward=dict(d_ff=48, activation="geglu_tanh", bias=False),
              normalization=dict(kind="rmsnorm_plus_one", eps=1e-6, sandwich=True),
              embedding=dict(scale=True, scale_in_dtype=True), head=dict(softcap=3.0))
    kw.update(overrides)
    return ModelConfig(**kw)


VARIANTS = {
    "qk_norm (Qwen3)": dict(layer_types=None, attention=dict(num_heads=4, head_dim=8, qk_norm=True),
                            normalization=dict(kind="rmsnorm"), head=dict()),
    "sliding everywhere (Mistral)": dict(layer_types=None, attention=dict(num_heads=4, num_kv_heads=2,
                                                                          sliding_window=5)),
    "Gemma 2": dict(),
    "Gemma 3 (qk_norm, local base)": dict(
        attention=dict(num_heads=4, num_kv_heads=1, head_dim=16, query_scalar=16.0, qk_norm=True, sliding_window=5),
        position=dict(kind="rope", base=1e6, local_base=10000.0), head=dict()),
}


# --- the modules, each against its formula -------------------------------------------------------------------

def test_qk_norm_is_rmsnorm_over_each_heads_dims_before_rope():
    rope = qkv.RotaryEmbedding(8)
    q_norm, k_norm = torch.nn.RMSNorm(8, eps=1e-6), torch.nn.RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5), k_norm.weight.uniform_(0.5, 1.5)
    mha = MultiHeadAttention(16, 2, head_dim=8, rope=rope, q_norm=q_norm, k_norm=k_norm).eval()
    x = torch.randn(2, 5, 16)
    q = mha.q_proj(x).view(2, 5, 2, 8).transpose(1, 2)  # (B, H, T, D)
    k = mha.k_proj(x).view(2, 5, 2, 8).transpose(1, 2)
    v = mha.v_proj(x).view(2, 5, 2, 8).transpose(1, 2)
    rms = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    q, k = rope(rms(q, q_norm.weight)), rope(rms(k, k_norm.weight))
    w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal_mask(5), -math.inf), -1)
    want = mha.out_proj((w @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(mha(x, is_causal=True), want, atol=1e-6, rtol=1e-5)


def test_rmsnorm_plus_one_scales_by_one_plus_its_weight():
    norm = RMSNormPlusOne(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(-0.5, 0.5)
    x = torch.randn(3, 8)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(norm(x), want)
    assert torch.equal(RMSNormPlusOne(8).weight, torch.zeros(8))  # starts as the identity's scale, 1 + 0


def test_softcap_bends_large_scores_and_takes_the_reference_path():
    q, k, v = torch.randn(1, 2, 4, 8) * 6, torch.randn(1, 2, 4, 8) * 6, torch.randn(1, 2, 4, 8)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    assert scores.abs().max() > 10  # large enough that tanh bends them at cap 5
    capped = 5.0 * torch.tanh(scores / 5.0)
    want = torch.softmax(capped.masked_fill(~causal_mask(4), -math.inf), -1) @ v
    got = scaled_dot_product_attention(q, k, v, is_causal=True, softcap=5.0)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-3)  # it bends
    prepared = qkv.nn.masks.prepare_mask(causal_mask(4))  # a prepared mask also takes the reference path
    torch.testing.assert_close(qkv.nn.attention.attend(q, k, v, mask=prepared, softcap=5.0), want)
    torch.testing.assert_close(soft_cap(torch.tensor([1e-3, 1e3]), 2.0), torch.tensor([1e-3, 2.0]))


def test_the_query_scale_replaces_one_over_root_d():
    mha = MultiHeadAttention(16, 2, head_dim=8, scale=12.0 ** -0.5).eval()
    x = torch.randn(1, 4, 16)
    q, k, v = (p(x).view(1, 4, 2, 8).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    w = torch.softmax((q @ k.transpose(-2, -1) * 12.0 ** -0.5).masked_fill(~causal_mask(4), -math.inf), -1)
    torch.testing.assert_close(mha(x, is_causal=True), mha.out_proj((w @ v).transpose(1, 2).reshape(1, 4, 16)))


@pytest.mark.parametrize("q_len, k_len, window", [(5, 5, 1), (5, 5, 3), (7, 7, 7), (7, 7, 9), (2, 9, 4), (1, 12, 5)])
def test_the_window_mask_is_hugging_faces_sliding_window_causal_mask(q_len, k_len, window):
    from transformers.masking_utils import sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(window)
    offset = k_len - q_len  # bottom-right: query i sits at cache position k_len − q_len + i
    t = torch.tensor
    want = torch.tensor([[bool(fn(t(0), t(0), t(offset + i), t(j))) for j in range(k_len)] for i in range(q_len)])
    assert torch.equal(sliding_window_mask(q_len, k_len, window), want)
    assert int(sliding_window_mask(q_len, k_len, window)[-1].sum()) == min(window, k_len)  # W keys, itself included


# --- the ring-buffer cache ----------------------------------------------------------------------------------

def test_the_ring_cache_keeps_the_window_only_and_equals_a_full_cache_with_the_window_mask():
    W, steps = 4, 16  # 4 W tokens
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, rope=qkv.RotaryEmbedding(4)).eval()
    x = torch.randn(2, steps, 16)
    ring, full = RingKVCache(2, 2, W, 4), KVCache(2, 2, steps, 4)
    uncached = mha(x, mask=sliding_window_mask(steps, steps, W))
    ring_out, full_out = [], []
    for t in range(0, steps, 3):  # chunks of 3, then 1: prefill and steps alike
        chunk = x[:, t:t + 3]
        ring_out.append(mha(chunk, is_causal=True, kv_cache=ring))  # no mask: the ring's own causal window
        full_out.append(mha(chunk, mask=sliding_window_mask(chunk.size(1), full.pos + chunk.size(1), W),
                            kv_cache=full))
        assert ring.k.shape == (2, 2, W, 4)  # constant, whatever the length so far
    torch.testing.assert_close(torch.cat(ring_out, 1), uncached, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(full_out, 1), uncached, atol=1e-6, rtol=1e-5)
    assert ring.pos == steps and ring.k.numel() * ring.k.element_size() * 2 == 2 * 2 * W * 4 * 4 * 2


def cache_bytes(caches) -> int:
    return sum(t.numel() * t.element_size() for c in caches for t in (c.k, c.v))


@pytest.mark.parametrize("W, chunks", [(1, [3, 1, 1, 1]), (4, [3, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1]),
                                       (4, [9, 1, 1, 1]), (6, [2, 1, 1, 1, 1])])
def test_the_ring_caches_static_form_places_its_keys_by_tensor_slots_alone(W, chunks):
    """write(input_pos) at slots from tensors only (no Python-int state): a prefill longer than the window,
    chunks, one-token steps, a window larger than everything written; the outputs equal the whole sequence
    under the window mask, and a refill from slot 0 forgets what was there; without a mask the ring's own
    causal window is the mask."""
    steps = sum(chunks)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, rope=qkv.RotaryEmbedding(4)).eval()
    x = torch.randn(2, steps, 16)
    want = mha(x, mask=sliding_window_mask(steps, steps, W))
    ring = RingKVCache(2, 2, W, 4, max_len=steps)
    for masked in (True, False):  # the second time over stale slots: a refill from slot 0
        out, t = [], 0
        for n in chunks:
            pos = torch.arange(t, t + n)  # (n,) slots
            keys = torch.arange(steps)  # (M,) the full key axis
            mask = (keys <= pos[:, None]) & (keys > pos[:, None] - W)  # (n, M): each query's causal window
            out.append(mha(x[:, t:t + n], mask=mask if masked else None, kv_cache=ring, input_pos=pos))
            t += n
        torch.testing.assert_close(torch.cat(out, 1), want, atol=1e-6, rtol=1e-5)
        assert ring.k.shape == (2, 2, W, 4) and ring.pos == 0  # constant memory; update's counter untouched


def test_the_ring_caches_memory_is_constant_where_a_full_caches_grows():
    """Bytes of every layer's caches of a model whose every layer slides (window 8), at 1, 4 and 16 windows."""
    config = ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=128, position=dict(kind="rope"),
                         attention=dict(num_heads=4, sliding_window=8))
    model, W = qkv.GPT(config).eval(), 8
    ring = {n: cache_bytes(model.new_kv_caches(1, n * W)) for n in (1, 4, 16)}
    full = {n: cache_bytes([KVCache(1, 4, n * W, 8) for _ in range(2)]) for n in (1, 4, 16)}
    assert ring == {n: full[1] for n in (1, 4, 16)}  # 2 layers · 2 (k, v) · 4 heads · 8 slots · 8 dims · 4 bytes
    assert full == {n: n * full[1] for n in (1, 4, 16)}


# --- inside qkv.GPT -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", VARIANTS)
def test_cached_decoding_past_the_window_equals_uncached(name):
    model = qkv.GPT(gemma_like(**VARIANTS[name])).eval()
    ids = torch.randint(0, 64, (2, 20))  # over 3 windows
    with torch.no_grad():
        want = model(ids).logits
        caches = model.new_kv_caches(2, 20)
        got = [model(ids[:, :7], kv_caches=caches).logits]
        got += [model(ids[:, t:t + 1], kv_caches=caches).logits for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-5)
    tokens = model.generate(ids[:, :3], 25, temperature=0)  # the static cache (ring layers too) vs none
    assert torch.equal(tokens, model.generate(ids[:, :3], 25, temperature=0, use_cache=False))


def test_a_left_padded_row_decodes_as_it_would_alone_with_sliding_layers():
    model = qkv.GPT(gemma_like()).eval()
    ids = torch.randint(0, 64, (1, 4))
    padded, mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1), torch.tensor([[False] * 3 + [True] * 4])
    alone = model.generate(ids, 16, temperature=0)
    assert torch.equal(model.generate(padded, 16, temperature=0, mask=mask)[:, 3:], alone)


def test_sliding_layers_are_banded_and_full_layers_are_not():
    model = qkv.GPT(gemma_like()).eval()
    att = model(torch.randint(0, 64, (1, 12)), return_attention=True).attentions
    assert torch.equal(att[0][0, 0] > 0, sliding_window_mask(12, 12, 6))  # layer 0 slides, window 6
    assert torch.equal(att[1][0, 0] > 0, causal_mask(12))  # layer 1 is global


def test_the_final_logits_are_soft_capped():
    model = qkv.GPT(gemma_like(head=dict(softcap=0.5))).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)
    logits = model(torch.randint(0, 64, (1, 5))).logits
    assert logits.abs().max() <= 0.5 and logits.abs().max() > 0.45


def test_embeddings_are_scaled_by_root_d_rounded_to_the_dtype():
    model = qkv.GPT(gemma_like()).to(torch.bfloat16)
    ids = torch.randint(0, 64, (1, 3))
    x = model.embed(ids, torch.arange(3))
    assert torch.equal(x, model.embed.tok(ids) * torch.tensor(math.sqrt(32), dtype=torch.bfloat16))


def test_the_config_round_trips_through_config_json(tmp_path):
    config = gemma_like(position=dict(kind="rope", local_base=10000.0, base=1e6))
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    assert ModelConfig.from_dict(json.loads((tmp_path / "config.json").read_text())) == config


def test_the_factory_builds_each_variant_with_hugging_faces_names():
    model = qkv.GPT(gemma_like(**VARIANTS["Gemma 3 (qk_norm, local base)"]))
    b0, b1 = model.blocks[0], model.blocks[1]
    assert isinstance(b0, SandwichTransformerBlock) and isinstance(b0.attn.q_norm, RMSNormPlusOne)
    names = {n for n, _ in b0.named_parameters()}
    assert {"attn.q_norm.weight", "attn.k_norm.weight", "attn_norm.weight", "attn_post_norm.weight",
            "ff_norm.weight", "ff_post_norm.weight"} <= names
    assert b0.attn.rope.base == 10000.0 and b1.attn.rope.base == 1e6  # local layers' own base
    assert b0.attn.scale == 16.0 ** -0.5 and b0.attn.softcap is None


# --- bad input, one clear error each ------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(attention=dict(num_heads=4, sliding_window=0)), "attention.sliding_window must be a positive int"),
    (dict(attention=dict(num_heads=4, sliding_window=-3)), "attention.sliding_window must be a positive int"),
    (dict(attention=dict(num_heads=4, sliding_window=49)), "sliding_window=49 is larger than max_len=48"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types must name each of the 4 layers"),
    (dict(layer_types=["local_attention"] * 4), r"unknown layer_types \['local_attention'\]"),
    (dict(attention=dict(num_heads=4)), "names sliding_attention layers, but attention.sliding_window is not set"),
    (dict(attention=dict(num_heads=4, softcap=0.0)), "attention.softcap must be a positive number or None"),
    (dict(attention=dict(num_heads=4, sliding_window=4, softcap=-1.0)), "attention.softcap must be a positive"),
    (dict(head=dict(softcap=0)), "head.softcap must be a positive number or None, got 0"),
    (dict(attention=dict(num_heads=4, sliding_window=4, qk_norm=True, kind="mla")), "qk_norm needs kind 'mha'"),
    (dict(position=dict(kind="alibi")), "sliding_attention layers with ALiBi are not supported"),
    (dict(normalization=dict(sandwich=True, first=False)), "normalization.sandwich needs sequential pre-norm"),
    (dict(position=dict(kind="learned", local_base=10000.0)), "local_base must be a RoPE base > 1 with positional"),
])
def test_bad_configs_are_refused_naming_what_was_given(change, message):
    with pytest.raises(ValueError, match=message):
        gemma_like(**change)


def test_qk_norm_over_unequal_head_widths_and_bad_modules_are_refused():
    with pytest.raises(ValueError, match=r"q_norm must normalise one head's 8 dims .* got a norm over \(16,\)"):
        MultiHeadAttention(16, 2, q_norm=torch.nn.RMSNorm(16))
    with pytest.raises(ValueError, match="softcap must be a positive number or None, got 0"):
        MultiHeadAttention(16, 2, softcap=0)
    with pytest.raises(ValueError, match="softcap must be a positive number or None"):
        scaled_dot_product_attention(torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4), softcap=-1.0)
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        sliding_window_mask(3, 3, 0)
    with pytest.raises(ValueError, match="sliding_attention layers are built for decoder-only models"):
        qkv.Encoder(gemma_like())
    ring = RingKVCache(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"a ring KV cache takes consecutive slots, got \[3, 2\]"):
        ring.write(torch.tensor([3, 2]), torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match=r"input_pos must be \(T=2,\) slots or \(B=1, T=2\) per row, got \(3,\)"):
        ring.write(torch.tensor([0, 1, 2]), torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))


# --- the fused step refuses each new field ------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("attention.query_scalar", 12.0), ("attention.softcap", 5.0),
    ("position.local_base", 1e4), ("normalization.sandwich", True),
    ("embedding.scale_in_dtype", True), ("head.softcap", 3.0),
])
def test_the_fused_step_refuses_every_new_field_at_a_non_default_value(field, value):
    section, name = field.split(".")
    base = ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=64, attention=dict(num_heads=4),
                       position=dict(kind="rope"))
    changed = base.replace(**{section: {**base.to_dict()[section], name: value}})
    assert fused_step.refuses_field(base) is None
    assert fused_step.refuses_field(changed) == f"config field {field}={value!r}, which the fused step does not declare"


@pytest.mark.parametrize("change, reason", [
    (dict(layer_types=["sliding_attention", "full_attention"], attention=dict(num_heads=4, sliding_window=8)), None),
    (dict(attention=dict(num_heads=4, sliding_window=8)), None),  # every layer sliding (Mistral)
    (dict(normalization=dict(kind="rmsnorm_plus_one")),
     "config field normalization.kind='rmsnorm_plus_one' (it computes 'layernorm' or 'rmsnorm')"),
])
def test_the_fused_step_takes_sliding_layers_and_refuses_the_plus_one_norm(change, reason):
    config = ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=64, attention=dict(num_heads=4),
                         position=dict(kind="rope"))
    assert fused_step.refuses_field(config.replace(**change)) == reason


def test_a_module_set_by_hand_is_refused_by_the_fused_step():
    model = qkv.GPT(ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=64, attention=dict(num_heads=4),
                                position=dict(kind="rope")))
    model.blocks[1].attn.softcap = 5.0
    assert fused_step.refuses_module(model) == "blocks.1.attn: attention with QK-norm, a scale or a soft cap " \
                                               "(it computes softmax(q·k/√D) v)"


# --- against Hugging Face's modules, weights copied ---------------------------------------------------------

def copy_decoder(hf, model, *, sandwich: bool) -> None:
    """Hugging Face's decoder-only weights into a qkv.GPT, by the names a family module will map."""
    layer_names = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj",
                   "self_attn.v_proj": "attn.v_proj", "self_attn.o_proj": "attn.out_proj",
                   "self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm",
                   "input_layernorm": "attn_norm", "mlp.gate_proj": "ff.gate_proj", "mlp.up_proj": "ff.up_proj",
                   "mlp.down_proj": "ff.down_proj"}
    layer_names |= ({"post_attention_layernorm": "attn_post_norm", "pre_feedforward_layernorm": "ff_norm",
                     "post_feedforward_layernorm": "ff_post_norm"} if sandwich
                    else {"post_attention_layernorm": "ff_norm"})  # LLaMA's and Qwen's name for the pre-FFN norm
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            name = name.removeprefix("model.")
            if name.startswith("layers."):
                _, i, rest = name.split(".", 2)
                sub, leaf = rest.rsplit(".", 1)
                target = f"blocks.{i}.{layer_names[sub]}.{leaf}"
            else:
                target = {"embed_tokens.weight": "embed.tok.weight", "norm.weight": "final_norm.weight",
                          "lm_head.weight": "lm_head.weight"}[name]
            if p.dim() == 1:
                p.uniform_(-0.3, 0.3).add_(0.0 if sandwich else 1.0)  # norms away from their start, both alike
            ours[target].copy_(p)


def test_gemma2_logits_equal_hugging_faces_past_the_window_with_softcapping_active():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    hf_config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=48,
                             query_pre_attn_scalar=12, sliding_window=6, attn_logit_softcapping=5.0,
                             final_logit_softcapping=3.0, attn_implementation="eager")
    hf = Gemma2ForCausalLM(hf_config).eval()
    with torch.no_grad():  # large enough that both caps bend: scores past 5, logits past 3
        hf.model.embed_tokens.weight.mul_(50)
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(8), layer.self_attn.k_proj.weight.mul_(8)
    model = qkv.GPT(gemma_like(layer_types=list(hf_config.layer_types))).eval()
    copy_decoder(hf, model, sandwich=True)
    ids = torch.randint(0, 64, (2, 20))  # over 3 windows of 6
    with torch.no_grad():
        want, got = hf(ids).logits, model(ids).logits
        for section, bent in (("head", lambda out: out.abs().max() > 6.0),  # past the final cap, 3
                              ("attention", lambda out: (out - got).abs().max() > 0.1)):  # another answer
            a = model.config.attention
            change = dict(head=dict(softcap=None)) if section == "head" else dict(attention=AttentionConfig(
                **{**a.__dict__, "softcap": None}))
            uncapped = qkv.GPT(model.config.replace(**change)).eval()
            uncapped.load_state_dict(model.state_dict())
            assert bent(uncapped(ids).logits), section
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_qwen3_logits_equal_hugging_faces_with_qk_norm_and_a_head_dim_apart():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=48,
                            tie_word_embeddings=False, attn_implementation="eager")
    hf = Qwen3ForCausalLM(hf_config).eval()
    config = ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=48,
                         position=dict(kind="rope", base=hf_config.rope_parameters["rope_theta"]),
                         attention=dict(num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, q_bias=False,
                                        k_bias=False, v_bias=False, out_bias=False),
                         feed_forward=dict(d_ff=48, activation="swiglu", bias=False),
                         normalization=dict(kind="rmsnorm", eps=hf_config.rms_norm_eps), head=dict(tie=False))
    model = qkv.GPT(config).eval()
    copy_decoder(hf, model, sandwich=False)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
