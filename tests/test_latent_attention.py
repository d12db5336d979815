"""Multi-head latent attention: the absorbed decode equals the naive one, cached equals uncached, the latent
cache's bytes are exact, and the module matches Hugging Face's DeepseekV3Attention weight for weight."""
import math

import pytest
import torch

import qkv
from qkv.nn.block import TransformerBlock
from qkv.nn.latent_attention import DecompressedKVCache, LatentCache, MultiHeadLatentAttention
from qkv.nn.layers import FeedForward, make_norm
from qkv.nn.masks import causal_mask, causal_mask_at, padding_mask, prepare_mask

ATOL = 1e-5
SIZES = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12)  # d_c, d_R, d_N, d_V
C, H = 32, 4


def make_mla(q_lora_rank=None, interleaved=False, **kw):
    rope = qkv.RotaryEmbedding(SIZES["qk_rope_head_dim"], interleaved=interleaved)
    return MultiHeadLatentAttention(C, H, **SIZES, q_lora_rank=q_lora_rank, rope=rope, **kw).eval()


def decode(mla, x, mode, prefill, masks=None):
    """Outputs (B, T, C) of a prefill of ``prefill`` tokens, then one token per call, through a ``mode`` cache;
    ``masks(S)``: the bool key mask for S keys so far (None: causal only)."""
    B, T, _ = x.shape
    cache = mla.new_cache(B, T, mode=mode)
    steps = [(0, prefill)] + [(t, t + 1) for t in range(prefill, T)]
    outs = [mla(x[:, a:b], is_causal=True, kv_cache=cache, mask=None if masks is None else masks(b))
            for a, b in steps]
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("interleaved", [False, True])
def test_absorbed_equals_naive_and_cached_equals_uncached(q_lora_rank, interleaved):
    mla = make_mla(q_lora_rank, interleaved)
    x = torch.randn(2, 8, C)
    full = mla(x, is_causal=True)
    naive, _ = decode(mla, x, "naive", prefill=4)
    absorbed, cache = decode(mla, x, "absorbed", prefill=4)
    torch.testing.assert_close(absorbed, naive, atol=ATOL, rtol=0)
    torch.testing.assert_close(naive, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(absorbed, full, atol=ATOL, rtol=0)
    assert isinstance(cache, LatentCache) and cache.pos == 8


def test_right_padded_batch_with_a_padding_mask():
    mla = make_mla(24, interleaved=True)
    T, prompt = 9, 6
    x = torch.randn(2, T, C)
    valid = torch.ones(2, T, dtype=torch.bool)
    valid[1, 3:prompt] = False  # row 1: 3 real tokens, 3 pads, then the decoded ones
    masks = lambda S: padding_mask(valid[:, :S])  # noqa: E731  (B, 1, 1, S)
    naive, _ = decode(mla, x, "naive", prefill=prompt, masks=masks)
    absorbed, _ = decode(mla, x, "absorbed", prefill=prompt, masks=masks)
    full = mla(x, is_causal=True, mask=masks(T))
    torch.testing.assert_close(absorbed, naive, atol=ATOL, rtol=0)
    torch.testing.assert_close(absorbed, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["naive", "absorbed"])
def test_static_slots_equal_the_growing_cache(mode):
    mla = make_mla(None, interleaved=True)
    x, M = torch.randn(2, 6, C), 8
    growing, _ = decode(mla, x, mode, prefill=3)
    cache, slots = mla.new_cache(2, M, mode=mode), torch.arange(M)
    outs = []
    for a, b in [(0, 3), (3, 4), (4, 5), (5, 6)]:
        allowed = causal_mask_at(slots[a:b], slots)  # (L, M): slot s is written and at or before the query's
        outs.append(mla(x[:, a:b], kv_cache=cache, input_pos=slots[a:b], mask=allowed))
    torch.testing.assert_close(torch.cat(outs, dim=1), growing, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["naive", "absorbed"])
def test_as_the_attention_of_a_block_with_a_prepared_mask(mode):
    """A TransformerBlock built around it (as the factory builds MHA's), the mask prepared once as the trunk does."""
    mla = make_mla(24)
    block = TransformerBlock.from_parts(mla, FeedForward(C, 64, "swiglu"), lambda: make_norm("rmsnorm", C),
                                        norm_first=True).eval()
    x = torch.randn(2, 5, C)
    full = block(x, is_causal=True).hidden
    cache = mla.new_cache(2, 5, mode=mode)
    outs = []
    for a, b in [(0, 2), (2, 3), (3, 4), (4, 5)]:
        mask = prepare_mask(torch.ones(2, 1, 1, b, dtype=torch.bool) & causal_mask(b - a, b))  # (B, 1, L, S)
        outs.append(block(x[:, a:b], mask=mask, kv_cache=cache).hidden)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_are_exact(dtype):
    mla = make_mla(24)
    B, M = 3, 10
    latent, naive = mla.new_cache(B, M, dtype=dtype), mla.new_cache(B, M, mode="naive", dtype=dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    d_c, d_r = SIZES["kv_lora_rank"], SIZES["qk_rope_head_dim"]
    assert latent.nbytes == (d_c + d_r) * B * M * size
    assert latent.numbers_per_token == d_c + d_r
    d_k, d_v = SIZES["qk_nope_head_dim"] + d_r, SIZES["v_head_dim"]
    assert naive.nbytes == H * (d_k + d_v) * B * M * size
    x = torch.randn(B, M, C, dtype=dtype)
    mla.to(dtype)(x, is_causal=True, kv_cache=latent)  # filling it allocates nothing more
    assert latent.nbytes == (d_c + d_r) * B * M * size and latent.pos == M
    assert latent.latent().shape == (B, 1, M, d_c) and latent.k_rope().shape == (B, 1, M, d_r)


@pytest.mark.parametrize("mode", ["naive", "absorbed"])
def test_return_weights_shape_and_agreement(mode):
    mla = make_mla(24)
    x = torch.randn(2, 5, C)
    cache = mla.new_cache(2, 7, mode=mode)
    mla(x, is_causal=True, kv_cache=cache)
    new = torch.randn(2, 2, C)
    out, weights = mla(new, is_causal=True, kv_cache=cache, return_weights=True)
    assert weights.shape == (2, H, 2, 7)  # (B, H, L, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 2), atol=ATOL, rtol=0)
    assert weights[:, :, 0, -1].abs().max() == 0  # the first new token does not see the second
    reference, _ = decode(mla, torch.cat((x, new), dim=1), "naive", prefill=5)
    torch.testing.assert_close(out, reference[:, 5:7], atol=ATOL, rtol=0)


def test_per_row_slots_write_each_row_at_its_own_end_through_row_views():
    """LatentCache.write with input_pos (B, T): row b's tokens at its slots; ``rows`` views share the buffer."""
    cache = LatentCache(3, 6, 4, 2)
    latent, k_rope = torch.randn(3, 1, 1, 4), torch.randn(3, 1, 1, 2)
    kv = cache.write(torch.tensor([[0], [4], [2]]), latent, k_rope)  # (3, 1, 6, 6)
    for b, slot in enumerate((0, 4, 2)):
        assert torch.equal(kv[b, 0, slot], torch.cat((latent[b, 0, 0], k_rope[b, 0, 0])))
    assert int((kv != 0).any(-1).sum()) == 3  # nothing else written
    cache.rows(1, 2).write(torch.tensor([5]), latent[:1], k_rope[:1])
    assert torch.equal(cache.kv[1, 0, 5], torch.cat((latent[0, 0, 0], k_rope[0, 0, 0])))
    with pytest.raises(ValueError, match=r"per-row input_pos must be \(B=3, T=1\), got \(3, 2\)"):
        cache.write(torch.zeros(3, 2, dtype=torch.long), latent, k_rope)
    with pytest.raises(ValueError, match="0 <= start < stop <= 3, got 2, 2"):
        cache.rows(2, 2)


def test_reorder_follows_the_chosen_rows():
    mla = make_mla()
    x = torch.randn(3, 4, C)
    cache = mla.new_cache(3, 4)
    mla(x, is_causal=True, kv_cache=cache)
    before = cache.kv.clone()
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.kv, before[[2, 2, 0]], atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"indices must be an integer tensor \(B=3,\)"):
        cache.reorder(torch.tensor([0, 1]))


@pytest.mark.parametrize("change, match", [
    (dict(kv_lora_rank=0), "kv_lora_rank must be a positive int, got 0"),
    (dict(kv_lora_rank=-4), "kv_lora_rank must be a positive int, got -4"),
    (dict(qk_rope_head_dim=7), "qk_rope_head_dim must be a positive even int .*got 7"),
    (dict(v_head_dim=None), "v_head_dim must be a positive int, got None"),
    (dict(v_head_dim=0), "v_head_dim must be a positive int, got 0"),
    (dict(qk_nope_head_dim=2.5), "qk_nope_head_dim must be a positive int, got 2.5"),
    (dict(q_lora_rank=0), "q_lora_rank must be a positive int or None, got 0"),
    (dict(softmax_scale=-0.1), "softmax_scale must be a positive finite float or None .*got -0.1"),
    (dict(dropout=1.5), r"dropout must be in \[0, 1\), got 1.5"),
    (dict(rope=qkv.RotaryEmbedding(4)), "rope must rotate all qk_rope_head_dim = 8 dims, got head_dim 4"),
])
def test_bad_configurations_say_what_was_expected(change, match):
    kw = dict(SIZES, rope=qkv.RotaryEmbedding(SIZES["qk_rope_head_dim"])) | change
    with pytest.raises(ValueError, match=match):
        MultiHeadLatentAttention(C, H, **kw)


def test_bad_calls_and_caches():
    mla = make_mla()
    with pytest.raises(ValueError, match="mode must be one of"):
        mla.new_cache(1, 4, mode="compressed")
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 32\), got \(1, 3, 16\)"):
        mla(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match=r"naive cache must hold .* = \(4, 16, 12\), got \(4, 16, 16\)"):
        mla(torch.randn(1, 3, C), kv_cache=qkv.KVCache(1, 4, 4, 16))
    with pytest.raises(ValueError, match=r"LatentCache widths .* must be \(16, 8\), got \(8, 8\)"):
        mla(torch.randn(1, 3, C), kv_cache=LatentCache(1, 4, 8, 8))
    with pytest.raises(TypeError, match="kv_cache must be a LatentCache or a KVCache"):
        mla(torch.randn(1, 3, C), kv_cache={})
    for mode in ("naive", "absorbed"):
        cache = mla.new_cache(1, 4, mode=mode)
        mla(torch.randn(1, 3, C), kv_cache=cache)
        with pytest.raises(ValueError, match=r"overflow: 3 cached \+ 2 new = 5 tokens > max_len=4"):
            mla(torch.randn(1, 2, C), kv_cache=cache)
    with pytest.raises(ValueError, match="value_dim must be a positive int"):
        DecompressedKVCache(1, 4, 4, 16, 0)


# Parity with Hugging Face's DeepseekV3Attention: same weights (copied by name), same hidden states, HF's own
# position embeddings (cos, sin) and an additive mask into HF; qkv's RoPE module and bool mask into qkv.
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}


def hf_pair(q_lora_rank, rope_interleave, attention_bias=False, rope_parameters=None):
    """Hugging Face's attention with random weights, its rotary embedding, and qkv's module holding the same weights."""
    pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    config = DeepseekV3Config(
        vocab_size=64, hidden_size=C, intermediate_size=64, num_hidden_layers=1, first_k_dense_replace=1,
        num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora_rank, **SIZES,
        rope_interleave=rope_interleave, attention_bias=attention_bias, max_position_embeddings=64,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    hf, rotary = DeepseekV3Attention(config, layer_idx=0).eval(), DeepseekV3RotaryEmbedding(config)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:  # norm weights (ones) and biases (zeros): made not trivial
                p.uniform_(-0.3, 0.3)
    scale = None
    if rope_parameters is not None:  # DeepSeek's YaRN: scale (d_N + d_R)^-1/2 · mscale², mscale = 0.1 ln(factor) + 1
        scale = (SIZES["qk_nope_head_dim"] + SIZES["qk_rope_head_dim"]) ** -0.5 * (0.1 * math.log(4.0) + 1) ** 2
    mine = make_mla(q_lora_rank, rope_interleave, bias=attention_bias, softmax_scale=scale)
    mine.load_state_dict(hf.state_dict())  # strict: the names are HF's, one to one
    if rope_parameters is None:  # qkv's own frequencies
        torch.testing.assert_close(mine.rope.inv_freq, rotary.inv_freq, atol=1e-7, rtol=0)
    else:  # YaRN's frequencies, HF's (qkv's RoPE scaling is a later piece)
        mine.rope.inv_freq.copy_(rotary.inv_freq)
    return hf, rotary, mine


@pytest.mark.parametrize("q_lora_rank, rope_interleave, attention_bias, rope_parameters", [
    (None, False, False, None), (None, True, False, None), (24, False, False, None), (24, True, True, None),
    (24, True, False, YARN)])
def test_matches_hugging_face_deepseek_v3_attention(q_lora_rank, rope_interleave, attention_bias, rope_parameters):
    hf, rotary, mine = hf_pair(q_lora_rank, rope_interleave, attention_bias, rope_parameters)
    assert mine.softmax_scale == pytest.approx(hf.scaling, rel=1e-12) and rotary.attention_scaling == 1.0
    B, T = 2, 7
    x = torch.randn(B, T, C)
    keys = padding_mask(torch.tensor([T, 5]), T)  # (B, 1, 1, T): right padding
    allowed = keys & causal_mask(T)  # (B, 1, T, T)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        want, want_weights = hf(x, rotary(x, torch.arange(T)[None].expand(B, T)), additive)
        got, weights = mine(x, mask=allowed, return_weights=True)
        absorbed, _ = decode(mine, x, "absorbed", prefill=4, masks=lambda S: keys[..., :S])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, want_weights, atol=ATOL, rtol=0)
    torch.testing.assert_close(absorbed, want, atol=ATOL, rtol=0)
