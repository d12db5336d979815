"""qkv.nn.sink_attention: the sink formula against a hand-written reference (Hugging Face gpt-oss's eager one: the
sink logit concatenated to the scores, softmax, its column dropped), the fused path equal to the reference path,
cached decoding (full and sliding ring caches) equal to the uncached forward, a padded batch without NaN, and the
speed layer (``qkv.kernels.accelerated``) giving the same logits."""
import pytest
import torch

import qkv
from qkv.kernels import accelerated
from qkv.nn.sink_attention import SinkAttention, sink_attention


def hf_eager(q, k, v, sinks, allowed):
    """gpt-oss's eager_attention_forward (transformers 5) with a bool mask, K/V heads repeated."""
    k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~allowed, torch.finfo(q.dtype).min)
    logits = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], dim=-1)
    probs = (logits - logits.max(dim=-1, keepdim=True).values).softmax(dim=-1)
    return probs[..., :-1] @ v, probs[..., :-1]


def test_the_sink_joins_the_denominator_and_takes_no_value():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    sinks = torch.randn(4)
    allowed = qkv.causal_mask(5, 7)
    want, want_weights = hf_eager(q, k, v, sinks, allowed)
    got, weights = sink_attention(q, k, v, sinks, mask=allowed, return_weights=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    assert (weights.sum(-1) < 1).all()  # the sink took some of each row's mass
    fused, none = sink_attention(q, k, v, sinks, is_causal=True)  # the fused kernel, the causal mask its own
    assert none is None
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=1e-5)


def test_a_very_negative_sink_is_plain_attention_and_a_row_with_no_key_gets_zeros():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    plain = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    out, _ = sink_attention(q, k, v, torch.full((2,), -1e4), is_causal=True)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-5)
    nothing = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    for return_weights in (False, True):
        out, _ = sink_attention(q, k, v, torch.zeros(2), mask=nothing, return_weights=return_weights)
        assert torch.equal(out, torch.zeros_like(out))


def test_sinks_of_the_wrong_shape_are_refused():
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"sinks must hold one logit per query head, shape \(4,\), got \(2,\)"):
        sink_attention(q, q, q, torch.zeros(2))


def sink_gpt(window=None):
    attention = dict(kind="sink", num_heads=4, num_kv_heads=2, sliding_window=window)
    model = qkv.GPT(qkv.ModelConfig(vocab_size=50, d_model=32, num_layers=2, max_len=64, attention=attention,
                                    position=dict(kind="rope"), normalization=dict(kind="rmsnorm"),
                                    feed_forward=dict(activation="swiglu"),
                                    layer_types=None if window is None else ["sliding_attention", "full_attention"]))
    with torch.no_grad():
        for block in model.blocks:
            assert isinstance(block.attn, SinkAttention)
            block.attn.sinks.normal_(0, 2.0)
    return model.eval()


@pytest.mark.parametrize("window", [None, 3])
@torch.no_grad()
def test_cached_decoding_equals_the_uncached_forward(window):
    model = sink_gpt(window)
    ids = torch.randint(0, 50, (1, 5))
    out = model.generate(ids, 8, temperature=0.0, use_cache=True)
    assert torch.equal(out, model.generate(ids, 8, temperature=0.0, use_cache=False))
    full = model(out).logits[0, -9:-1]  # each generated token's logits, recomputed at once
    assert torch.equal(full.argmax(-1), out[0, 5:])


@torch.no_grad()
def test_a_left_padded_batch_equals_each_row_alone_and_the_speed_layer_changes_nothing():
    model = sink_gpt(window=3)
    ids = torch.randint(0, 50, (2, 9))
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1, :3] = False
    logits = model(ids, mask=keep).logits
    assert not logits.isnan().any()
    torch.testing.assert_close(logits[1, 3:], model(ids[1:, 3:]).logits[0], atol=1e-5, rtol=1e-5)
    with accelerated(model):
        torch.testing.assert_close(model(ids, mask=keep).logits[keep], logits[keep], atol=1e-5, rtol=1e-5)


def test_the_weights_come_back_without_the_sink_column():
    model = sink_gpt()
    out = model(torch.randint(0, 50, (1, 6)), return_attention=True)
    weights = out.attentions[0]
    assert weights.shape == (1, 4, 6, 6) and (weights.sum(-1) < 1).all()
