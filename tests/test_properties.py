"""Property-based tests of attention (hypothesis): random shapes, heads, masks, biases and dtypes."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkv

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _fp16_works() -> bool:
    try:
        x = torch.randn(1, 2, 4, dtype=torch.float16)
        torch.nn.functional.scaled_dot_product_attention(x, x, x)
        return True
    except RuntimeError:
        return False


DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if _fp16_works() else [])


@st.composite
def attention_inputs(draw):
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    L, S, D = draw(st.integers(1, 8)), draw(st.integers(1, 10)), draw(st.integers(1, 16))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (L, S, S))
    mask_kind = draw(st.sampled_from(["none", "random", "padding", "empty_row"]))
    mask = None
    if mask_kind == "random":
        mask = torch.rand(B, 1, L, S, generator=g) > draw(st.floats(0.0, 0.9))
    elif mask_kind == "padding":
        mask = qkv.padding_mask(torch.randint(0, S + 1, (B,), generator=g), max_len=S)
    elif mask_kind == "empty_row":
        mask = torch.ones(B, H, L, S, dtype=torch.bool)
        mask[0, 0, draw(st.integers(0, L - 1))] = False
    bias = torch.randn(H, L, S, generator=g).to(dtype) * 3 if draw(st.booleans()) else None
    return q, k, v, mask, bias, draw(st.booleans()), dtype


@SETTINGS
@given(attention_inputs())
def test_reference_and_fused_agree_without_nan(inputs):
    q, k, v, mask, bias, causal, dtype = inputs
    fused = qkv.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=causal)
    ref, w = qkv.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, is_causal=causal, return_weights=True)
    assert torch.isfinite(fused).all() and torch.isfinite(ref).all() and torch.isfinite(w).all()
    torch.testing.assert_close(fused.float(), ref.float(), atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)
    sums = w.float().sum(-1)
    live = sums > 0  # rows with at least one allowed key sum to 1; the others are exactly 0
    torch.testing.assert_close(sums[live], torch.ones_like(sums[live]), atol=TOL[dtype] * 10, rtol=0)
    assert (w.float().sum(-1)[~live] == 0).all()


@SETTINGS
@given(st.integers(1, 2), st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 2)]), st.integers(2, 7),
       st.sampled_from(["none", "rope", "alibi"]), st.integers(0, 2**31 - 1))
def test_cached_equals_uncached(B, heads, T, pos, seed):
    torch.manual_seed(seed)
    H, G = heads
    extra = {"rope": {"rope": qkv.RotaryEmbedding(4)}, "alibi": {"alibi": qkv.ALiBi(H)}, "none": {}}[pos]
    mha = qkv.MultiHeadAttention(4 * H, H, num_kv_heads=G, **extra).eval()
    x = torch.randn(B, T, 4 * H)
    cache = qkv.KVCache(B, G, T, 4)
    steps = torch.cat([mha(x[:, t:t + 1], is_causal=True, kv_cache=cache) for t in range(T)], dim=1)
    torch.testing.assert_close(steps, mha(x, is_causal=True), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_scores_do_not_overflow(dtype):
    q = torch.full((1, 1, 4, 8), 40.0).to(dtype)  # scores ≈ 40·40·8/√8 ≈ 4.5e3
    k = torch.randn(1, 1, 6, 8).to(dtype) * 40
    v = torch.randn(1, 1, 6, 8).to(dtype)
    fused = qkv.scaled_dot_product_attention(q, k, v)
    ref, w = qkv.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert torch.isfinite(fused).all() and torch.isfinite(w).all()
    torch.testing.assert_close(w.float().sum(-1), torch.ones(1, 1, 4), atol=TOL[dtype] * 10, rtol=0)
    torch.testing.assert_close(fused.float(), ref.float(), atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)


def test_long_sequence_fused_is_finite_and_matches_reference_rows():
    q, k, v = (torch.randn(1, 2, 2048, 16) for _ in range(3))
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref, _ = qkv.scaled_dot_product_attention(q[..., -4:, :], k, v, is_causal=True, return_weights=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[..., -4:, :], ref, atol=1e-5, rtol=0)


def test_bf16_training_step_has_finite_loss_and_grads():
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", position=dict(kind="rope")))
    ids = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, targets=ids.roll(-1, 1)).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
