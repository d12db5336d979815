import pytest
import torch

import qkv
from qkv.nn.kv_cache import RingKVCache, reorder_kv

ATOL = 1e-5


def make_mha(kind, kv_heads=4):
    pos = {"rope": {"rope": qkv.RotaryEmbedding(4)}, "alibi": {"alibi": qkv.ALiBi(4)}, "none": {}}[kind]
    return qkv.MultiHeadAttention(16, 4, num_kv_heads=kv_heads, **pos).eval()


@pytest.mark.parametrize("kind", ["rope", "alibi", "none"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_token_by_token_equals_full_forward(kind, kv_heads):
    mha = make_mha(kind, kv_heads)
    x = torch.randn(2, 7, 16)
    full = mha(x, is_causal=True)
    cache = qkv.KVCache(2, kv_heads, 7, 4)
    steps = [mha(x[:, :3], is_causal=True, kv_cache=cache)]  # chunked prefill, then one token at a time
    steps += [mha(x[:, t:t + 1], is_causal=True, kv_cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    assert cache.pos == 7


@pytest.mark.parametrize("positional", ["rope", "alibi", "none", "learned", "sinusoidal"])
def test_gpt_cached_logits_equal_full_forward(positional):
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", attention=dict(num_kv_heads=2), position=dict(kind=positional))).eval()
    ids = torch.randint(0, 64, (2, 9))
    full = model(ids).logits
    caches = model.new_kv_caches(2, 9)
    parts = [model(ids[:, :4], kv_caches=caches).logits]
    parts += [model(ids[:, t:t + 1], kv_caches=caches).logits for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)


def test_overflow_reset_and_shape_errors():
    cache = qkv.KVCache(1, 2, 4, 8)
    k = torch.randn(1, 2, 3, 8)
    cache.update(k, k)
    with pytest.raises(ValueError, match=r"overflow.*3 cached \+ 2 new = 5 tokens > max_len=4"):
        cache.update(k[:, :, :2], k[:, :, :2])
    cache.reset()
    kk, vv = cache.update(k, k)
    assert cache.pos == 3 and kk.shape == (1, 2, 3, 8)
    ptr = cache.k.data_ptr()
    cache.update(k[:, :, :1], k[:, :, :1])
    assert cache.k.data_ptr() == ptr  # no reallocation per token
    with pytest.raises(ValueError, match="expected k and v"):
        cache.update(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))
    with pytest.raises(ValueError, match="max_len"):
        qkv.KVCache(1, 2, 0, 8)


def test_cross_attention_refuses_a_cache():
    mha = qkv.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="cross-attention"):
        mha(torch.randn(1, 2, 8), torch.randn(1, 3, 8), kv_cache=qkv.KVCache(1, 2, 4, 4))


@pytest.mark.parametrize("kind", ["rope", "alibi", "none"])
def test_static_cache_write_equals_growing_cache(kind):
    mha = make_mha(kind)
    x = torch.randn(2, 6, 16)
    full = mha(x, is_causal=True)
    cache = qkv.KVCache(2, 4, 8, 4)  # capacity 8 > 6: slots 6, 7 stay unwritten and masked
    outs = []
    for t in range(6):
        mask = (torch.arange(8) <= t)[None, None, None, :]  # (1, 1, 1, M): slots written so far
        outs.append(mha(x[:, t:t + 1], mask=mask, kv_cache=cache, input_pos=torch.tensor([t])))
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="kv_cache"):
        mha(x, input_pos=torch.arange(6))


def test_compiled_decode_step_compiles_once_and_matches(monkeypatch):
    import torch._dynamo

    import qkv.generation.backends as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")  # graph capture only: fast, same guards
    torch._dynamo.reset()
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", position=dict(kind="rope")))
    ids = torch.randint(0, 64, (2, 5))
    expected = model.generate(ids, 12, temperature=0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = model.generate(ids, 12, temperature=0, compile="inductor")  # a recompile per token would raise
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="use_cache"):
        model.generate(ids, 2, compile=True, use_cache=False)


def test_reorder_takes_rows_in_place_and_reorder_kv_selects_rows():
    torch.manual_seed(0)
    cache = qkv.KVCache(3, 2, 4, 8)
    k, v = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2, 8)
    cache.update(k, v)
    ptr, idx = cache.k.data_ptr(), torch.tensor([2, 0, 0])
    cache.reorder(idx)
    assert cache.k.data_ptr() == ptr and cache.pos == 2  # same buffers, same fill level
    assert torch.equal(cache.k[:, :, :2], k[idx]) and torch.equal(cache.v[:, :, :2], v[idx])
    kk, vv = cache.update(k[:, :, :1], v[:, :, :1])  # decoding goes on from the chosen rows
    assert torch.equal(kk, torch.cat([k[idx], k[:, :, :1]], dim=2)) and torch.equal(vv[:, :, :2], v[idx])
    pairs = reorder_kv([(k, v), (v, k)], torch.tensor([1, 1, 0, 2]))  # B' = 4 ≠ B = 3: one row per beam
    assert torch.equal(pairs[0][0], k[[1, 1, 0, 2]]) and torch.equal(pairs[1][0], v[[1, 1, 0, 2]])
    with pytest.raises(ValueError, match="one row per cache row, B=3, got 2"):
        cache.reorder(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"integer tensor \(B,\).*torch.float32"):
        cache.reorder(torch.zeros(3))
    with pytest.raises(ValueError, match="integer tensor"):
        reorder_kv([(k, v)], [0, 1])


@pytest.mark.parametrize("positional, window", [("rope", None), ("learned", None), ("none", None), ("rope", 4)])
def test_per_row_input_pos_decodes_each_row_as_alone(positional, window):
    """Rows of different lengths in one static cache, each writing at its own end (input_pos (B, 1)): every row's
    logits equal those of its sequence decoded alone; with a window of 4, rows past it (ring caches) too."""
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", position=dict(kind=positional),
                                           attention=dict(num_heads=4, sliding_window=window, num_kv_heads=2))).eval()
    seqs = [torch.randint(0, 64, (n,)) for n in (3, 7, 5, 9)]
    M = 10
    caches, slots = model.new_kv_caches(4, M), torch.zeros(4, M, dtype=torch.bool)
    for b, s in enumerate(seqs):  # each row's prefix alone, through a view of its row
        slots[b, :len(s) - 1] = True
        model(s[None, :-1], mask=slots[b:b + 1], kv_caches=[c.rows(b, b + 1) for c in caches],
              input_pos=torch.arange(len(s) - 1))
    pos = torch.tensor([[len(s) - 1] for s in seqs])  # (B, 1): each row's next slot
    slots.scatter_(1, pos, True)
    last = model(torch.stack([s[-1:] for s in seqs]), mask=slots, kv_caches=caches, input_pos=pos).logits[:, -1]
    alone = torch.stack([model(s[None]).logits[0, -1] for s in seqs])
    torch.testing.assert_close(last, alone, atol=ATOL, rtol=0)


def test_per_row_input_pos_refuses_a_wrong_shape():
    with pytest.raises(ValueError, match=r"input_pos must be \(T=1,\) slots or \(B=2, T=1\) per row, got \(2, 3\)"):
        RingKVCache(2, 1, 4, 4).write(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 1, 1, 4),
                                      torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match=r"per-row input_pos must be \(B=2, T=1\), got \(2, 3\)"):
        qkv.KVCache(2, 1, 8, 4).write(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 1, 1, 4),
                                      torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match="0 <= start < stop <= 2, got 1, 1"):
        qkv.KVCache(2, 1, 8, 4).rows(1, 1)
