"""The paged model's decode attention (qkv.generation.paged_attention): grouped one-query products against the
reference formula, and the swap that puts them in the model's attention modules for a block."""
import pytest
import torch

import qkv
from qkv.generation.paged import PagedModel
from qkv.generation.paged_attention import DecodeAttention, decode_attention, grouped_one_query
from qkv.nn.attention import MultiHeadAttention, reference_attention
from qkv.nn.masks import prepare_mask


@pytest.mark.parametrize("per_head", [False, True])
def test_grouped_one_query_equals_the_reference_under_a_mask_with_an_empty_row(per_head):
    """Rows of one query over grouped heads (H 6, G 2), a bool mask per row (per head too), one row with no key:
    the reference's outputs, that row zeros."""
    torch.manual_seed(0)
    B, H, G, S, D = 3, 6, 2, 7, 4
    q, k, v = torch.randn(B, H, 1, D), torch.randn(B, G, S, D), torch.randn(B, G, S, D)
    allowed = torch.rand(B, H if per_head else 1, 1, S) < 0.6
    allowed[0, :, :, 0] = True  # row 0 sees at least one key; row 2 none
    allowed[2] = False
    want, _ = reference_attention(q, k, v, allowed, None, 0.3, 0.0)
    got = grouped_one_query(q, k, v, prepare_mask(allowed), 0.3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_grouped_one_query_in_bf16_stays_near_the_fp32_reference():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    allowed = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    want, _ = reference_attention(q, k, v, allowed, None, 8 ** -0.5, 0.0)
    got = grouped_one_query(q.bfloat16(), k.bfloat16(), v.bfloat16(), prepare_mask(allowed, torch.bfloat16), 8 ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)


def tiny(**attention) -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=50, max_len=64, position=dict(kind="rope"),
                                          attention=dict(num_heads=4, **attention, num_kv_heads=2))).eval()


def test_decode_attention_swaps_the_plain_attention_modules_for_the_block_only():
    model = tiny()
    plain = [m for m in model.modules() if type(m) is MultiHeadAttention]
    assert plain
    with pytest.raises(RuntimeError), decode_attention(model):
        assert all(type(m) is DecodeAttention for m in plain)
        raise RuntimeError("inside")
    assert all(type(m) is MultiHeadAttention for m in plain)


@pytest.mark.parametrize("attention", [{}, {"softcap": 5.0}])
def test_the_paged_models_steps_equal_the_reference_attentions(attention, monkeypatch):
    """Rows of one token at different positions (and a two-token chunk, and a soft-capped model, which keep the
    reference core): the logits of the grouped core equal those of the reference one."""
    import contextlib

    import qkv.generation.paged as paged_module

    model = tiny(**attention)
    a, b = torch.randint(0, 50, (1, 11)), torch.randint(0, 50, (1, 6))

    def steps() -> torch.Tensor:
        paged = PagedModel(model, 12, block_size=4)
        ta, tb = [paged.blocks.allocate() for _ in range(3)], [paged.blocks.allocate() for _ in range(2)]
        with torch.no_grad():
            paged.forward(a[:, :9], [0], [ta])
            paged.forward(b[:, :5], [0], [tb])
            one = paged.forward(torch.cat((a[:, 9:10], b[:, 5:6])), [9, 5], [ta, tb])  # (2, V)
            two = paged.forward(torch.cat((a[:, 9:11], a[:, 9:11])), [9, 9], [ta, ta])  # a chunk of two
        return torch.cat((one, two))

    fast = steps()
    monkeypatch.setattr(paged_module, "decode_attention", contextlib.nullcontext)
    torch.testing.assert_close(fast, steps(), rtol=1e-5, atol=1e-5)
