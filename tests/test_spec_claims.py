"""The spec's claims, checked on qkv's modules (the correct form of each)."""
import pytest
import torch

import qkv


def encode(x, scheme):
    """Add position information to x (B, T, C) by the given scheme, then one attention layer."""
    T, C, H = x.size(1), x.size(2), 4
    kw = {}
    if scheme == "sinusoidal":
        x = x + qkv.SinusoidalPositionalEncoding(C)(T)
    elif scheme == "learned":
        x = x + qkv.LearnedPositionalEmbedding(T, C)(T)
    elif scheme == "rope":
        kw["rope"] = qkv.RotaryEmbedding(C // H)
    elif scheme == "alibi":
        kw["alibi"] = qkv.ALiBi(H)
    torch.manual_seed(1)
    return qkv.MultiHeadAttention(C, H, **kw)(x)


@pytest.mark.parametrize("scheme", ["none", "sinusoidal", "learned", "rope", "alibi"])
def test_permutation_equivariance_without_pe_only(scheme):
    """Spec §3.4 done right: permute the input rows and compare with the permuted output."""
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.manual_seed(2)
    out = encode(x, scheme)
    torch.manual_seed(2)
    out_perm = encode(x[:, perm], scheme)
    equivariant = torch.allclose(out_perm, out[:, perm], atol=1e-5)
    assert equivariant == (scheme == "none")


def test_causal_output_has_zero_gradient_wrt_later_inputs():
    mha = qkv.MultiHeadAttention(16, 4)
    x = torch.randn(1, 6, 16, requires_grad=True)
    mha(x, is_causal=True)[0, 2].sum().backward()
    assert (x.grad[0, 3:] == 0).all() and (x.grad[0, :3] != 0).any()


def test_scores_are_not_symmetric_and_a_token_attends_to_itself():
    sa = qkv.SelfAttention(16)
    x = torch.randn(1, 5, 16)
    scores = sa.q_proj(x) @ sa.k_proj(x).transpose(-2, -1)
    assert not torch.allclose(scores, scores.transpose(-2, -1))
    _, w = sa(x, return_weights=True)
    assert (torch.diagonal(w, dim1=-2, dim2=-1) > 0).all()


def test_output_is_a_convex_combination_of_value_rows():
    q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 3)
    out, w = qkv.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4))
    assert ((out >= v.min(0).values - 1e-6) & (out <= v.max(0).values + 1e-6)).all()
