"""scaled_dot_product_attention, SelfAttention, MultiHeadAttention: behaviour, equivalence, bad input."""
import math
import re

import pytest
import torch
from torch import nn

import qkv
from qkv.interop.torch_nn import mask_from_torch, mha_from_torch

ATOL = 1e-5


def rand(*shape, grad=False):
    return torch.randn(*shape, requires_grad=grad)


# --- the function: reference path == fused path -------------------------------------


def both_paths(q, k, v, **kw):
    fused = qkv.scaled_dot_product_attention(q, k, v, **kw)
    ref, w = qkv.scaled_dot_product_attention(q, k, v, return_weights=True, **kw)
    return fused, ref, w


@pytest.mark.parametrize("L,S", [(5, 5), (3, 7), (1, 9)])
def test_reference_equals_fused_with_masks_bias_and_causal(L, S):
    q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 6)
    mask = torch.rand(2, 1, L, S) > 0.3
    bias = rand(3, L, S)
    for kw in ({}, {"mask": mask}, {"bias": bias}, {"is_causal": True}, {"mask": mask, "bias": bias, "is_causal": True},
               {"scale": 0.3}):
        fused, ref, w = both_paths(q, k, v, **kw)
        assert fused.shape == (2, 3, L, 6) and w.shape == (2, 3, L, S)
        torch.testing.assert_close(fused, ref, atol=ATOL, rtol=0)


def test_reference_is_the_spec_formula():
    q, k, v = rand(4, 8), rand(6, 8), rand(6, 5)
    out, w = qkv.scaled_dot_product_attention(q, k, v, return_weights=True)
    expected_w = torch.softmax(q @ k.T / math.sqrt(8), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


def test_matches_torch_sdpa_square_causal():
    q, k, v = rand(2, 2, 6, 4), rand(2, 2, 6, 4), rand(2, 2, 6, 4)
    ours = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_causal_aligns_bottom_right():
    q, k, v = rand(1, 2, 4), rand(1, 5, 4), rand(1, 5, 4)
    _, w = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    # query 0 of 2 over 5 keys sees keys 0..3, query 1 sees all 5
    assert (w[0, 0, 4] == 0) and (w[0, 0, :4] > 0).all() and (w[0, 1] > 0).all()


def test_weights_rows_sum_to_one():
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 7, 8), rand(2, 3, 7, 8)
    _, w = qkv.scaled_dot_product_attention(q, k, v, mask=torch.rand(5, 7) > 0.2, return_weights=True)
    live = w.sum(-1) > 0
    torch.testing.assert_close(w.sum(-1)[live], torch.ones_like(w.sum(-1)[live]))


@pytest.mark.parametrize("path", ["fused", "reference"])
def test_fully_masked_rows_give_zero_without_nan(path):
    q, k, v = rand(2, 2, 4, 8, grad=True), rand(2, 2, 5, 8, grad=True), rand(2, 2, 5, 8, grad=True)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # batch 0, query 1 may attend to nothing
    res = qkv.scaled_dot_product_attention(q, k, v, mask=mask, return_weights=path == "reference")
    out = res[0] if path == "reference" else res
    assert torch.isfinite(out).all()
    assert (out[0, :, 1] == 0).all() and (out[1, :, 1] != 0).any()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, :, 1] == 0).all()


def test_minus_inf_bias_counts_as_masked():
    q, k, v = rand(1, 3, 4), rand(1, 3, 4), rand(1, 3, 4)
    bias = torch.zeros(3, 3)
    bias[0] = float("-inf")
    fused, ref, w = both_paths(q, k, v, bias=bias)
    assert torch.isfinite(fused).all() and (w[0, 0] == 0).all()
    torch.testing.assert_close(fused, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "args,kw,error,words",
    [
        ((rand(4), rand(3, 4), rand(3, 4)), {}, ValueError, "(..., len, dim)"),
        ((rand(2, 4), rand(3, 5), rand(3, 5)), {}, ValueError, "last dim"),
        ((rand(2, 4), rand(3, 4), rand(2, 4)), {}, ValueError, "same length"),
        ((rand(2, 2, 4), rand(3, 3, 4), rand(3, 3, 4)), {}, ValueError, "leading dims"),
        ((rand(2, 4), rand(3, 4), rand(3, 4)), {"mask": torch.ones(4, 3, dtype=torch.bool)}, ValueError, "broadcast"),
        ((rand(2, 4), rand(3, 4), rand(3, 4)), {"mask": torch.ones(2, 3)}, TypeError, "bool"),
        ((rand(2, 4), rand(3, 4), rand(3, 4)), {"bias": torch.ones(2, 3, dtype=torch.long)}, TypeError, "floating"),
        ((torch.ones(2, 4, dtype=torch.long),) * 3, {}, TypeError, "floating-point"),
        ((rand(2, 4), rand(3, 4), rand(3, 4)), {"dropout_p": 1.5}, ValueError, "dropout_p"),
    ],
)
def test_bad_input_names_expected_and_actual(args, kw, error, words):
    with pytest.raises(error, match=r".*" + __import__("re").escape(words)):
        qkv.scaled_dot_product_attention(*args, **kw)


def test_score_variance_grows_with_dk_and_scaling_restores_one():
    for d in (16, 64, 256):
        q, k = torch.randn(20000, d), torch.randn(20000, d)
        raw = (q * k).sum(-1)
        assert abs(raw.var().item() / d - 1) < 0.05
        assert abs((raw / math.sqrt(d)).var().item() - 1) < 0.05


# --- modules ----------------------------------------------------------------------------


def test_self_attention_is_the_spec_module():
    sa = qkv.SelfAttention(8)
    x = rand(2, 5, 8)
    out, w = sa(x, return_weights=True)
    q, k, v = sa.q_proj(x), sa.k_proj(x), sa.v_proj(x)
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1) @ v, atol=ATOL, rtol=0)
    assert out.shape == x.shape and sa.q_proj.bias is None
    torch.testing.assert_close(sa(x), out, atol=ATOL, rtol=0)


@pytest.mark.parametrize("h", [1, 2, 4, 8])
def test_parameter_count_is_four_d_squared(h):
    d = 64
    assert sum(p.numel() for p in qkv.MultiHeadAttention(d, h).parameters()) == 4 * d * d


def test_heads_split_to_b_h_t_d():
    mha = qkv.MultiHeadAttention(16, 4)
    x = rand(2, 5, 16)
    out, w = mha(x, return_weights=True)
    assert out.shape == (2, 5, 16) and w.shape == (2, 4, 5, 5)
    # head 1 is attention over columns 4:8 of the projections (the right axes, unlike spec §2.1)
    q, k = mha.q_proj(x)[..., 4:8], mha.k_proj(x)[..., 4:8]
    torch.testing.assert_close(w[:, 1], torch.softmax(q @ k.transpose(-2, -1) / 2, -1), atol=ATOL, rtol=0)


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = qkv.MultiHeadAttention(16, 4, num_kv_heads=2)
    full = qkv.MultiHeadAttention(16, 4)
    with torch.no_grad():
        full.q_proj.weight.copy_(gqa.q_proj.weight)
        full.out_proj.weight.copy_(gqa.out_proj.weight)
        for mine, theirs in ((full.k_proj, gqa.k_proj), (full.v_proj, gqa.v_proj)):
            w = theirs.weight.view(2, 4, 16).repeat_interleave(2, dim=0)  # (G, D, C) -> (H, D, C)
            mine.weight.copy_(w.reshape(16, 16))
    x = rand(2, 6, 16)
    torch.testing.assert_close(gqa(x, is_causal=True), full(x, is_causal=True), atol=ATOL, rtol=0)
    assert gqa.k_proj.weight.shape == (8, 16)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_mha_fused_equals_reference(kv_heads):
    mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=kv_heads, bias=True)
    x, ctx = rand(2, 5, 16), rand(2, 7, 16)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    for kw in ({"is_causal": True}, {"context": ctx, "mask": mask}):
        out = mha(x, **kw)
        ref, _ = mha(x, return_weights=True, **kw)
        torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_cross_attention_takes_keys_from_context():
    mha = qkv.MultiHeadAttention(8, 2)
    x, ctx = rand(1, 3, 8), rand(1, 6, 8)
    out, w = mha(x, ctx, return_weights=True)
    assert out.shape == (1, 3, 8) and w.shape == (1, 2, 3, 6)
    out2 = mha(x, ctx + 1)
    assert not torch.allclose(out, out2)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_attending_over_projected_context_kv_equals_attending_over_context(kv_heads):
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 2, num_kv_heads=kv_heads, bias=True, kv_dim=12).eval()
    x, ctx = rand(2, 3, 16), rand(2, 5, 12)
    k, v = mha.project_kv(ctx)
    assert k.shape == v.shape == (2, kv_heads, 5, 8)  # (B, G, S, D): G heads stored, not H
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]  # (B, 1, 1, S)
    for weights in (False, True):
        want = mha(x, ctx, mask=mask, return_weights=weights)
        got = mha(x, context_kv=(k, v), mask=mask, return_weights=weights)
        for a, b in zip(got if weights else [got], want if weights else [want]):
            assert torch.equal(a, b)


def test_context_kv_bad_input():
    mha, x, ctx = qkv.MultiHeadAttention(8, 2, num_kv_heads=1), rand(2, 3, 8), rand(2, 5, 8)
    k, v = mha.project_kv(ctx)
    with pytest.raises(ValueError, match="not both"):
        mha(x, ctx, context_kv=(k, v))
    with pytest.raises(ValueError, match=r"\(B, G, D\) = \(2, 1, 4\), got \[\(1, 1, 5, 4\), \(1, 1, 5, 4\)\]"):
        mha(x, context_kv=(k[:1], v[:1]))
    with pytest.raises(ValueError, match=r"\(k, v\).*got \[\(2, 1, 5, 4\)\]"):
        mha(x, context_kv=(k,))
    with pytest.raises(ValueError, match="self-attention"):
        mha(x, context_kv=(k, v), kv_cache=qkv.KVCache(2, 1, 4, 4))
    with pytest.raises(ValueError, match=r"\(B, S, 8\), got \(2, 5\)"):
        mha.project_kv(ctx[..., 0])
    with pytest.raises(ValueError, match="rope"):
        qkv.MultiHeadAttention(8, 2, rope=qkv.RotaryEmbedding(4))(x, context_kv=(k, v))


@pytest.mark.parametrize(
    "kwargs,words",
    [({"d_model": 10, "num_heads": 3}, "divisible"), ({"d_model": 16, "num_heads": 4, "num_kv_heads": 3}, "multiple"),
     ({"d_model": 16, "num_heads": 0}, "positive"), ({"d_model": 16, "num_heads": 4, "dropout": 1.0}, "dropout")],
)
def test_mha_bad_config(kwargs, words):
    with pytest.raises(ValueError, match=words):
        qkv.MultiHeadAttention(**kwargs)


def test_mha_bad_input():
    mha = qkv.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(B, T, 8\).*\(2, 3, 4\)"):
        mha(rand(2, 3, 4))
    with pytest.raises(ValueError, match="context"):
        mha(rand(2, 3, 8), rand(2, 3, 5))
    with pytest.raises(ValueError, match="batch"):
        mha(rand(2, 3, 8), rand(3, 3, 8))
    with pytest.raises(ValueError, match="broadcast"):
        mha(rand(2, 3, 8), mask=torch.ones(2, 1, 3, 4, dtype=torch.bool))


# --- parity with torch.nn.MultiheadAttention (weights copied) ------------------------


@pytest.mark.parametrize("bias", [False, True])
def test_parity_with_torch_mha(bias):
    ref = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True).eval()
    ours = mha_from_torch(ref).eval()
    x = rand(3, 6, 16)
    lengths = torch.tensor([6, 4, 2])
    kpm = torch.arange(6)[None] >= lengths[:, None]  # torch polarity: True = padding
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)  # torch polarity: True = future
    for attn_mask, key_padding_mask in ((None, None), (None, kpm), (causal, None), (causal, kpm)):
        expected, expected_w = ref(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                   need_weights=True, average_attn_weights=False)
        mask, _ = mask_from_torch(attn_mask, key_padding_mask)
        got, w = ours(x, mask=mask, return_weights=True)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(w, expected_w, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x, mask=mask), expected, atol=ATOL, rtol=0)
    # is_causal alone, no explicit mask
    expected, _ = ref(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(ours(x, is_causal=True), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kwargs, named", [
    (dict(num_kv_heads=2), "grouped-query heads"), (dict(rope=qkv.RotaryEmbedding(4)), "RoPE"),
    (dict(alibi=qkv.ALiBi(4)), "ALiBi"), (dict(softcap=5.0), "soft cap"), (dict(scale=0.3), "scale apart"),
    (dict(relative_bias=qkv.T5RelativePositionBias(4, bidirectional=True)), "relative position bias (T5)"),
    (dict(q_norm=torch.nn.RMSNorm(4), k_norm=torch.nn.RMSNorm(4)), "QK-norm"),
    (dict(head_dim=8), "head_dim apart"), (dict(bias=(True, True, True, False)), "bias on some projections"),
])
def test_what_nn_multiheadattention_cannot_hold_is_refused_by_name(kwargs, named):
    from qkv.interop.torch_nn import mha_to_torch

    with pytest.raises(ValueError, match=re.escape(f"nn.MultiheadAttention has no {named}")):
        mha_to_torch(qkv.MultiHeadAttention(16, 4, **kwargs))
    mha_to_torch(qkv.MultiHeadAttention(16, 4, bias=True))  # the plain one converts
