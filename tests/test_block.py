import pytest
import torch
from torch import nn

import qkv
from qkv.interop.torch_nn import encoder_layer_from_torch, encoder_layer_to_torch, mask_from_torch

ATOL = 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_block_equals_torch_encoder_layer(norm_first, activation):
    ref = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
                                     norm_first=norm_first).eval()
    ours = encoder_layer_from_torch(ref).eval()
    assert ours.norm_first == norm_first
    x = torch.randn(2, 5, 16)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])  # torch polarity: True = padding
    mask, _ = mask_from_torch(None, kpm)
    # torch's fast path returns zeros at padded positions; compare real positions only
    expected = ref(x, src_key_padding_mask=kpm)
    got = ours(x, mask=mask).hidden
    torch.testing.assert_close(got[~kpm], expected[~kpm], atol=ATOL, rtol=0)
    torch.testing.assert_close(ours(x).hidden, ref(x), atol=ATOL, rtol=0)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    torch.testing.assert_close(ours(x, is_causal=True).hidden, ref(x, src_mask=causal, is_causal=True),
                               atol=ATOL, rtol=0)


def test_round_trip_block_torch_block():
    block = qkv.TransformerBlock(16, 4, 32, norm_first=True).eval()
    back = encoder_layer_from_torch(encoder_layer_to_torch(block)).eval()
    x = torch.randn(2, 5, 16)
    assert torch.equal(block(x).hidden, back(x).hidden)
    for (n1, p1), (n2, p2) in zip(block.state_dict().items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_a_parallel_block_is_not_written_as_a_sequential_torch_layer():
    from qkv.models import ModelConfig, components

    cfg = ModelConfig(d_model=16, attention=dict(num_heads=4), num_layers=1, feed_forward=dict(parallel=True))
    block = components.blocks(cfg, 1)[0]
    with pytest.raises(ValueError, match="sequential .* got a ParallelTransformerBlock"):
        encoder_layer_to_torch(block)


def test_post_ln_and_pre_ln_are_the_equations():
    block = qkv.TransformerBlock(8, 2, 16).eval()
    x = torch.randn(1, 3, 8)
    h = block.attn_norm(x + block.attn(x))
    torch.testing.assert_close(block(x).hidden, block.ff_norm(h + block.ff(h)))
    block.norm_first = True
    h = x + block.attn(block.attn_norm(x))
    torch.testing.assert_close(block(x).hidden, h + block.ff(block.ff_norm(h)))


def test_cross_attention_block():
    block = qkv.TransformerBlock(8, 2, 16, cross_attention=True).eval()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    out, w_self, w_cross = block(x, memory, is_causal=True, return_weights=True)
    assert out.shape == (2, 3, 8) and w_self.shape == (2, 2, 3, 3) and w_cross.shape == (2, 2, 3, 5)
    assert (w_self[..., 0, 1:] == 0).all()
    with pytest.raises(ValueError, match="context"):
        block(x)
    with pytest.raises(ValueError, match="not both"):
        block(x, memory, context_kv=block.cross_attn.project_kv(memory))


def test_block_output_is_one_structure_with_weights_only_when_asked():
    torch.manual_seed(0)
    plain, cross = qkv.TransformerBlock(8, 2, 16).eval(), qkv.TransformerBlock(8, 2, 16, cross_attention=True).eval()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    r = plain(x)
    assert isinstance(r, qkv.nn.block.BlockOutput) and r.self_attention is None and r.cross_attention is None
    w = plain(x, return_weights=True)
    torch.testing.assert_close(w.hidden, r.hidden, atol=ATOL, rtol=0)  # reference vs fused attention path
    assert w.self_attention.shape == (2, 2, 3, 3) and w.cross_attention is None
    r = cross(x, memory, is_causal=True)
    assert r.self_attention is None and r.cross_attention is None
    w = cross(x, memory, is_causal=True, return_weights=True)
    torch.testing.assert_close(w.hidden, r.hidden, atol=ATOL, rtol=0)
    assert w.self_attention.shape == (2, 2, 3, 3) and w.cross_attention.shape == (2, 2, 3, 5)


def test_block_over_projected_context_equals_block_over_context():
    torch.manual_seed(0)
    block = qkv.TransformerBlock(8, 2, 16, cross_attention=True, num_kv_heads=1).eval()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    context_mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])[:, None, None, :]  # (B, 1, 1, S)
    want = block(x, memory, context_mask=context_mask, return_weights=True)
    got = block(x, context_kv=block.cross_attn.project_kv(memory), context_mask=context_mask, return_weights=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert (got.cross_attention[1, ..., 2:] == 0).all()


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_feed_forward(activation):
    ff = qkv.FeedForward(8, 16, activation)
    x = torch.randn(2, 3, 8)
    if activation == "swiglu":
        expected = ff.down_proj(torch.nn.functional.silu(ff.gate_proj(x)) * ff.up_proj(x))
    else:
        expected = ff.down_proj(ff.act(ff.up_proj(x)))
    torch.testing.assert_close(ff(x), expected)
    with pytest.raises(ValueError, match="activation must be one of"):
        qkv.FeedForward(8, 16, "tanh")
