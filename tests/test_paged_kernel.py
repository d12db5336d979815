"""torch.ops.qkv.paged_decode_attention against the reference: the keys gathered from the pools, then
``grouped_one_query`` (the paged model's decode attention), in fp32 and bf16 pools, with masked positions, rows
sharing blocks and a row with no allowed key."""
import math

import pytest
import torch

from qkv.generation.paged_attention import grouped_one_query
from qkv.kernels import build
from qkv.nn.masks import PreparedMask

pytestmark = pytest.mark.skipif(not build.available(), reason=f"qkv's C++ kernels are not built here: {build.why_not()}")


def case(dtype, B=5, H=9, G=3, D=64, N=12, K=16, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(N, G, K, D, generator=g).to(dtype) for _ in range(2))
    table = torch.randint(0, N, (B, n), generator=g)
    table[1] = table[0]  # two rows sharing their blocks (a common prefix)
    q = torch.randn(B, H, D, generator=g)
    lengths = torch.tensor([40, 33, 48, 1, 17])[:B]
    bias = torch.where(torch.arange(n * K) < lengths[:, None], 0.0, -math.inf)  # (B, S)
    return q, k, v, table, bias


def reference(q, k, v, table, bias, scale):
    """Each row's blocks gathered in position order, (B, G, S, D), then the grouped one-query core."""
    B, n = table.shape
    gathered = [pool[table].permute(0, 2, 1, 3, 4).reshape(B, pool.size(1), -1, pool.size(3)) for pool in (k, v)]
    mask = PreparedMask(bias[:, None, None, :] == 0, bias[:, None, None, :].to(k.dtype), None)
    out = grouped_one_query(q.to(k.dtype)[:, :, None], *gathered, mask, scale)  # (B, H, 1, D)
    return out[:, :, 0].float()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_equals_gathering_then_the_grouped_core(dtype, tol):
    assert build.load()
    q, k, v, table, bias = case(dtype)
    scale = 1 / 8
    got = torch.ops.qkv.paged_decode_attention(q, k, v, table, bias, scale)
    torch.testing.assert_close(got, reference(q, k, v, table, bias, scale), atol=tol, rtol=tol)


def test_a_row_with_no_allowed_key_gets_zeros_and_one_bias_row_serves_all():
    assert build.load()
    q, k, v, table, bias = case(torch.float32)
    bias[3] = -math.inf
    got = torch.ops.qkv.paged_decode_attention(q, k, v, table, bias, 0.125)
    assert torch.equal(got[3], torch.zeros_like(got[3]))
    shared = torch.ops.qkv.paged_decode_attention(q, k, v, table, bias[:1].contiguous(), 0.125)
    want = torch.ops.qkv.paged_decode_attention(q, k, v, table, bias[:1].expand_as(bias).contiguous(), 0.125)
    torch.testing.assert_close(shared, want, atol=0, rtol=0)


def test_bad_shapes_are_refused_naming_what_is_expected():
    assert build.load()
    q, k, v, table, bias = case(torch.float32)
    with pytest.raises(RuntimeError, match="q must be"):
        torch.ops.qkv.paged_decode_attention(q.double(), k, v, table, bias, 0.125)
    with pytest.raises(RuntimeError, match="table must be"):
        torch.ops.qkv.paged_decode_attention(q, k, v, table[:2], bias, 0.125)
    with pytest.raises(RuntimeError, match="bias must be"):
        torch.ops.qkv.paged_decode_attention(q, k, v, table, bias[:, :5].contiguous(), 0.125)
