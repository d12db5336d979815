"""The paged KV cache (qkv.nn.paged_kv_cache), its block manager (qkv.generation.blocks) and the model over it
(qkv.generation.paged): the same keys and logits as the contiguous cache and the full forward."""
import pytest
import torch

import qkv
from qkv.generation.blocks import BlockManager, NoBlocks, block_keys
from qkv.generation.paged import PagedModel
from qkv.nn.kv_cache import KVCache
from qkv.nn.paged_kv_cache import PagedKVCache, PageTable


def test_write_then_gather_equals_the_contiguous_cache_through_scattered_blocks():
    """Two rows of different lengths, their blocks out of order in the pool: the gathered keys at each row's
    written positions equal a KVCache's slots."""
    torch.manual_seed(0)
    G, D, K = 2, 4, 3
    pages = PageTable(K)
    paged = PagedKVCache(10, G, D, pages=pages)
    flat = KVCache(2, G, 9, D)
    pages.set(torch.tensor([[7, 2, 5], [0, 9, 9]]))  # row 1 holds 2 blocks, padded with its own
    lengths = (8, 5)
    for start, T in ((0, 5), (5, 1), (6, 2)):
        k, v = torch.randn(2, G, T, D), torch.randn(2, G, T, D)
        pos = torch.tensor([[min(start + t, L - 1) for t in range(T)] for L in lengths])  # (2, T)
        got_k, got_v = paged.write(pos, k, v)
        want_k, want_v = flat.write(pos, k, v)
        assert got_k.shape == (2, G, 9, D)
        for b, L in enumerate(lengths):
            written = min(start + T, L)
            assert torch.equal(got_k[b, :, :written], want_k[b, :, :written])
            assert torch.equal(got_v[b, :, :written], want_v[b, :, :written])
    assert torch.equal(paged.k[2, :, 0], flat.k[0, :, 3])  # position 3 of row 0: block 2, offset 0


def test_without_autograd_gathers_reuse_one_buffer_and_equal_a_fresh_gather():
    """Two layers' caches over one PageTable: under no_grad each gather lands in the table's workspace (one buffer
    per pool shape and kind, grown when a step needs more blocks), equal to the fresh gather autograd gets."""
    torch.manual_seed(0)
    pages = PageTable(4)
    layers = [PagedKVCache(8, 2, 4, pages=pages) for _ in range(2)]
    for cache in layers:  # the pools start as torch.empty: unwritten slots could hold NaN, never equal to itself
        cache.k.zero_()
        cache.v.zero_()
    for table, pos in (([[3, 1], [6, 6]], [[5], [2]]), ([[3, 1, 0], [6, 2, 2]], [[8], [6]])):
        pages.set(torch.tensor(table))
        k = v = torch.randn(2, 2, 1, 4)
        for cache in layers:
            fresh = cache.write(torch.tensor(pos), k, v)
            with torch.no_grad():
                reused = cache.write(torch.tensor(pos), k, v)
            assert all(torch.equal(a, b) for a, b in zip(fresh, reused))
            assert reused[0].data_ptr() == pages.workspace["k", layers[0].k.shape[1:], torch.float32,
                                                           torch.device("cpu")].data_ptr()
            assert fresh[0].data_ptr() != reused[0].data_ptr()


def test_the_paged_model_gives_the_full_forwards_logits_for_rows_at_different_lengths():
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=50, max_len=64, position=dict(kind="rope"),
                                           attention=dict(num_heads=4, sliding_window=5, num_kv_heads=2))).eval()
    a, b = torch.randint(0, 50, (1, 13)), torch.randint(0, 50, (1, 6))
    paged = PagedModel(model, 12, block_size=4)
    ta, tb = [paged.blocks.allocate() for _ in range(4)], [paged.blocks.allocate() for _ in range(2)]
    with torch.no_grad():
        paged.forward(a[:, :9], [0], [ta[:3]])  # a chunk of a's prompt
        paged.forward(b[:, :5], [0], [tb])
        got = paged.forward(torch.cat((a[:, 9:10], b[:, 5:6])), [9, 5], [ta[:3], tb])  # (2, V): one step each
        want_a = model(a[:, :10]).logits[:, -1]
        want_b = model(b).logits[:, -1]
    torch.testing.assert_close(got, torch.cat((want_a, want_b)), rtol=1e-5, atol=1e-5)


def test_paged_writes_refuse_what_they_cannot_place():
    pages = PageTable(4)
    cache = PagedKVCache(3, 2, 8, pages=pages)
    k = torch.zeros(1, 2, 2, 8)
    with pytest.raises(ValueError, match="set its PageTable"):
        cache.write(torch.tensor([[0, 1]]), k, k)
    pages.set(torch.tensor([[0]]))
    with pytest.raises(ValueError, match=r"per-row positions input_pos \(B=1, T=2\), got \(2,\)"):
        cache.write(torch.tensor([0, 1]), k, k)
    with pytest.raises(ValueError, match="block table must be an integer tensor"):
        pages.set(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(0, 2, 8, pages=pages)


def test_blocks_are_counted_cached_matched_and_evicted_least_recent_first():
    m = BlockManager(4, 2)
    ids = [1, 2, 3, 4, 5]
    keys = block_keys(ids, 2)
    assert len(keys) == 2 and keys == block_keys(ids, 2, keys[:1]) and keys[0] != block_keys([1, 2, 3, 5], 2)[1]
    a = [m.allocate(), m.allocate(), m.allocate()]
    m.register(a, keys)  # a's first two blocks hold [1, 2], [3, 4]
    assert m.match(keys) == a[:2] and m.refs[a[0]] == 2  # held twice now
    m.release(a[:2])
    m.release(a)
    assert m.available == 4 and set(m.cached) == set(a[:2])  # the keyed ones stay cached
    assert m.match(block_keys([1, 2, 9, 9], 2)) == [a[0]]  # a prefix of one block
    m.release([a[0]])
    taken = [m.allocate() for _ in range(3)]  # 2 free ones, then the least recently freed cached one: a[1]
    assert a[1] in taken and m.match(keys) == [a[0]]
    with pytest.raises(NoBlocks):
        m.allocate()
    m.release(taken[:1])
    with pytest.raises(ValueError, match="nobody holds it"):
        m.release(taken[:1])


def test_page_table_slots_are_computed_once_per_unchanged_positions_tensor():
    pages = PageTable(4)
    pages.set(torch.tensor([[5, 2], [7, 1]]))
    input_pos = torch.tensor([[1, 6], [4, 5]])  # (B, T): every layer writes at the step's one tensor
    expected = torch.tensor([5 * 4 + 1, 2 * 4 + 2, 1 * 4 + 0, 1 * 4 + 1])
    assert torch.equal(pages.slots(input_pos), expected) and pages.slots(input_pos) is pages.slots(input_pos)
    input_pos.sub_(1)  # changed in place: computed again
    assert torch.equal(pages.slots(input_pos), torch.tensor([5 * 4 + 0, 2 * 4 + 1, 7 * 4 + 3, 1 * 4 + 0]))
    pages.set(torch.tensor([[3, 0], [6, 0]]))  # a new step's tables: computed again
    assert torch.equal(pages.slots(input_pos), torch.tensor([3 * 4 + 0, 0 * 4 + 1, 6 * 4 + 3, 0 * 4 + 0]))
    with torch.inference_mode():
        fresh = torch.tensor([[0, 1], [2, 3]])
        assert torch.equal(pages.slots(fresh), torch.tensor([12, 13, 26, 27])) and pages.written is None


def test_the_paged_model_computes_logits_for_the_rows_asked_only(monkeypatch):
    """forward(..., rows): the head reads only those rows (k, V), each equal to the full forward's row; the head
    takes its whole input again after."""
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=50, max_len=64, position=dict(kind="rope"),
                                           attention=dict(num_heads=4, num_kv_heads=2))).eval()
    ids = torch.randint(0, 50, (1, 7))
    seen = []
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].size(0)))
    paged = PagedModel(model, 4, block_size=4)
    table = [paged.blocks.allocate() for _ in range(2)]
    with torch.no_grad():
        paged.forward(ids[:, :4], [0], [table])
        rows = torch.tensor(ids[0, 4:7])[:, None]  # (3, 1): a folded prompt's rest, one row per token
        every = paged.forward(rows, [4, 5, 6], [table] * 3)
        last = paged.forward(rows, [4, 5, 6], [table] * 3, [2])
        again = paged.forward(rows, [4, 5, 6], [table] * 3, [0, 1, 2])
    assert seen == [1, 3, 1, 3] and last.shape == (1, 50)
    torch.testing.assert_close(last, every[2:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(again, every, rtol=0, atol=0)
