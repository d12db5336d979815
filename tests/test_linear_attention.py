"""linear_attention: the O(n) form equals the O(n²) matrix form, is the paper's formula, costs O(n) FLOPs."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import qkv

ATOL = 1e-5


def rand(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


# --- equivalence: linear form == quadratic form ---------------------------------------


@pytest.mark.parametrize("L,S", [(5, 5), (3, 7), (9, 4), (1, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("feature_map", ["elu1", "relu"])
def test_linear_equals_quadratic(L, S, is_causal, feature_map):
    q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 6)
    kw = {"is_causal": is_causal, "feature_map": feature_map}
    out = qkv.linear_attention(q, k, v, **kw)
    assert out.shape == (2, 3, L, 6)
    torch.testing.assert_close(out, qkv.linear_attention_quadratic(q, k, v, **kw), atol=ATOL, rtol=0)


def test_long_causal_sums_agree_in_float64():
    q, k, v = (rand(1, 2, 512, 16, dtype=torch.float64) for _ in range(3))
    out = qkv.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, qkv.linear_attention_quadratic(q, k, v, is_causal=True), atol=1e-10, rtol=0)


def test_gradients_equal_quadratic():
    grads = []
    for attend in (qkv.linear_attention, qkv.linear_attention_quadratic):
        torch.manual_seed(1)
        q, k, v = rand(2, 6, 4, grad=True), rand(2, 9, 4, grad=True), rand(2, 9, 3, grad=True)
        attend(q, k, v, is_causal=True).pow(2).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


# --- behaviour: the paper's formula ---------------------------------------------------


def test_is_the_paper_formula_row_by_row():
    q, k, v = rand(4, 3), rand(6, 3), rand(6, 2)
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    out = qkv.linear_attention(q, k, v, is_causal=True, eps=1e-6)
    for i in range(4):
        seen = range(6 - 4 + i + 1)  # bottom-right: query i sees keys 0 … S − L + i
        num = sum(phi(q[i]) @ phi(k[j]) * v[j] for j in seen)
        den = sum(phi(q[i]) @ phi(k[j]) for j in seen)
        torch.testing.assert_close(out[i], num / (den + 1e-6), atol=ATOL, rtol=0)


def test_causal_is_an_rnn_over_keys():
    # The output of query t with all keys up to t equals a run on the prefix alone: no peeking.
    q, k, v = rand(1, 10, 4), rand(1, 10, 4), rand(1, 10, 4)
    full = qkv.linear_attention(q, k, v, is_causal=True)
    for t in (0, 4, 9):
        prefix = qkv.linear_attention(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], is_causal=True)
        torch.testing.assert_close(full[:, t:t + 1], prefix, atol=ATOL, rtol=0)


def test_queries_that_see_no_key_get_zeros():
    q, k, v = rand(1, 5, 4), rand(1, 2, 4), rand(1, 2, 3)
    out = qkv.linear_attention(q, k, v, is_causal=True)  # queries 0 … 2 of 5 over 2 keys see none
    assert torch.equal(out[0, :3], torch.zeros(3, 3)) and (out[0, 3:] != 0).all()


def test_differs_from_softmax_attention():
    q, k, v = rand(2, 6, 8), rand(2, 6, 8), rand(2, 6, 4)
    diff = (qkv.linear_attention(q, k, v) - qkv.scaled_dot_product_attention(q, k, v)).abs().max()
    assert diff > 1e-2


# --- cost: O(n) FLOPs for the linear form, O(n²) for the quadratic --------------------


def flops(fn, n, is_causal):
    q, k, v = rand(1, 2, n, 8), rand(1, 2, n, 8), rand(1, 2, n, 8)
    with FlopCounterMode(display=False) as counter:
        fn(q, k, v, is_causal=is_causal)
    return counter.get_total_flops()


@pytest.mark.parametrize("is_causal", [False, True])
def test_flops_grow_linearly_vs_quadratically(is_causal):
    linear = [flops(qkv.linear_attention, n, is_causal) for n in (64, 128, 256)]
    quadratic = [flops(qkv.linear_attention_quadratic, n, is_causal) for n in (64, 128, 256)]
    assert linear[1] == 2 * linear[0] and linear[2] == 2 * linear[1]
    assert quadratic[1] == 4 * quadratic[0] and quadratic[2] == 4 * quadratic[1]
    assert quadratic[0] == 2 * (2 * 64 * 64 * 8) * 2  # B·H = 2 heads of φ(Q)φ(K)ᵀ and A V, 2·n²·8 each


# --- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [qkv.linear_attention, qkv.linear_attention_quadratic])
@pytest.mark.parametrize("args,kw,error,match", [
    ((rand(8), rand(5, 8), rand(5, 3)), {}, ValueError, r"q must have shape \(\.\.\., len, dim\), got shape \(8,\)"),
    ((rand(4, 8), rand(5, 6), rand(5, 3)), {}, ValueError, r"share their last dim.*q \(4, 8\), k \(5, 6\)"),
    ((rand(4, 8), rand(5, 8), rand(6, 3)), {}, ValueError, r"same length.*k \(5, 8\), v \(6, 3\)"),
    ((rand(2, 4, 8), rand(3, 5, 8), rand(3, 5, 3)), {}, ValueError, r"leading dims"),
    ((rand(4, 8), [[1.0]], rand(5, 3)), {}, TypeError, r"k must be a floating-point Tensor, got list"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"feature_map": "softmax"}, ValueError,
     r"feature_map must be one of \['elu1', 'relu'\], got 'softmax'"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"eps": 0.0}, ValueError, r"eps must be a positive number, got 0\.0"),
])
def test_bad_input(fn, args, kw, error, match):
    with pytest.raises(error, match=match):
        fn(*args, **kw)
