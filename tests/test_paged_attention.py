"""The paged model's decode attention (qkv.generation.paged_attention): grouped one-query products against the
reference formula, and the swap that puts them in the model's attention modules for a block."""
import pytest
import torch

import qkv
from qkv.generation.paged import PagedModel
from qkv.kernels import build
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


def test_grouped_one_query_reads_gathered_strided_keys_as_the_reference():
    """Keys and values as the paged cache gathers them, a (B, S, G, D) copy viewed as (B, G, S, D): the reference's."""
    torch.manual_seed(0)
    B, H, G, S, D = 3, 6, 3, 10, 4
    q = torch.randn(B, H, 1, D)
    k, v = torch.randn(B, S, G, D).transpose(1, 2), torch.randn(B, S, G, D).transpose(1, 2)  # (B, G, S, D) views
    allowed = torch.rand(B, 1, 1, S) < 0.7
    allowed[..., 0] = True
    want, _ = reference_attention(q, k.contiguous(), v.contiguous(), allowed, None, 0.5, 0.0)
    torch.testing.assert_close(grouped_one_query(q, k, v, prepare_mask(allowed), 0.5), want, rtol=1e-6, atol=1e-6)


def test_the_rotary_angles_of_a_step_are_computed_once_for_every_layer(monkeypatch):
    """Inside decode_attention the rotary modules are StepRotary: a second call (another layer, or another module of
    the same frequencies) for the same positions takes the first's angles; a new or changed positions tensor, or
    other frequencies, compute again; the class is restored."""
    from qkv.generation.paged_attention import StepRotary
    from qkv.nn.positional import RotaryEmbedding

    ropes = torch.nn.ModuleList([RotaryEmbedding(8), RotaryEmbedding(8), RotaryEmbedding(8, base=500.0)])
    calls = []
    computed = RotaryEmbedding.angles
    monkeypatch.setattr(RotaryEmbedding, "angles", lambda self, p: calls.append(p) or computed(self, p))
    positions = torch.tensor([[3], [7]])
    with decode_attention(ropes):
        assert all(type(r) is StepRotary for r in ropes)
        first = ropes[0].angles(positions)
        assert ropes[0].angles(positions) is first and ropes[1].angles(positions) is first and len(calls) == 1
        other = ropes[2].angles(positions)  # other frequencies
        assert len(calls) == 2 and not torch.equal(other[0], first[0])
        positions.add_(1)  # changed in place: computed again
        again = ropes[1].angles(positions)
        assert len(calls) == 3 and torch.equal(again[0], computed(ropes[1], torch.tensor([[4], [8]]))[0])
        ropes[0].angles(torch.tensor([[4], [8]]))  # another tensor: computed again
        assert len(calls) == 4
    assert all(type(r) is RotaryEmbedding and not hasattr(r, "shared") for r in ropes)


def test_the_paged_model_swaps_once_inside_decoding(monkeypatch):
    """PagedModel.decoding swaps the modules once for every forward inside (a server's run), and restores them."""
    import qkv.generation.paged as paged_module

    model = tiny()
    swaps = []
    swap = paged_module.decode_attention
    monkeypatch.setattr(paged_module, "decode_attention", lambda m: swaps.append(m) or swap(m))
    paged = PagedModel(model, 8, block_size=4)
    table = [paged.blocks.allocate() for _ in range(2)]
    with torch.no_grad():
        alone = paged.forward(torch.tensor([[1, 2, 3]]), [0], [table])
        assert len(swaps) == 1
        with paged.decoding():
            inside = paged.forward(torch.tensor([[1, 2, 3]]), [0], [table])
            paged.forward(torch.tensor([[4]]), [3], [table])
            assert all(type(m) is DecodeAttention for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert len(swaps) == 2 and torch.equal(alone, inside)
    assert not any(type(m) is DecodeAttention for m in model.modules())


def folded_step(model, monkeypatch):
    """(what each paged layer's write returned, its keys, in the last step; step()): step() prefills two prompts
    over a fresh paged model, then runs one forward where the first decodes and the second's last 4 tokens are
    folded (rows of one token over one table) -> that forward's logits (5, V)."""
    from qkv.nn.paged_kv_cache import PagedKVCache

    a, b = torch.randint(0, 50, (1, 11)), torch.randint(0, 50, (1, 7))
    returned = []
    write = PagedKVCache.write
    monkeypatch.setattr(PagedKVCache, "write", lambda self, *args: returned.append((w := write(self, *args))[0]) or w)

    def step() -> torch.Tensor:
        paged = PagedModel(model, 12, block_size=4)
        ta, tb = [paged.blocks.allocate() for _ in range(3)], [paged.blocks.allocate() for _ in range(2)]
        with torch.no_grad():
            paged.forward(a[:, :10], [0], [ta])
            paged.forward(b[:, :3], [0], [tb])
            returned.clear()
            rows = torch.cat((a[0, 10:11], b[0, 3:7]))[:, None]  # a decodes; b's rest is folded, 4 rows
            return paged.forward(rows, [10, 3, 4, 5, 6], [ta] + [tb] * 4)

    return returned, step


@pytest.mark.parametrize("attention", [{}, {"softcap": 5.0}, {"sliding_window": 3}])
def test_rows_sharing_a_table_read_its_keys_once_with_the_reference_answer(attention, monkeypatch):
    """Folded prompts' rests (rows of one token over one table) beside a decoding row: with DecodeAttention the
    keys are gathered once per table (RowGroups) and read by shared_keys_query (a soft cap: taken per row for the
    reference core); the logits equal the reference attention's."""
    import contextlib

    import qkv.generation.paged as paged_module

    model = tiny(**attention)
    monkeypatch.setattr(paged_module.kernels, "available", lambda: False)  # keys gathered, not read in place
    gathered, step = folded_step(model, monkeypatch)

    fast = step()
    assert all(k.size(0) == 2 for k in gathered)  # two tables, not five rows
    monkeypatch.setattr(paged_module, "decode_attention", contextlib.nullcontext)
    reference = step()
    assert all(k.size(0) == 5 for k in gathered)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)


def test_row_groups_place_each_row_by_its_table_and_rank():
    from qkv.nn.paged_kv_cache import row_groups

    groups = row_groups([[1, 2], [3, 4], [3, 4], [1, 2], [3, 4]])
    assert groups.table.tolist() == [[1, 2], [3, 4]]
    assert groups.width == 3 and groups.places.tolist() == [0, 3, 4, 1, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_step_rotary_equals_the_reference_rotation_bit_for_bit(dtype):
    """StepRotary's whole-width rotation over its step tables: the reference's values exactly, at per-row positions
    (B, T) and (T,), for queries and keys of other head counts sharing the tables; interleaved, partial and
    follows-length rotations are the reference's own."""
    from qkv.nn.positional import RotaryEmbedding

    torch.manual_seed(0)
    kinds = ({}, {"interleaved": True}, {"rotary_dim": 4})
    ropes = torch.nn.ModuleList([RotaryEmbedding(8, **kind) for kind in kinds])
    want_modules = [RotaryEmbedding(8, **kind) for kind in kinds]
    q, k = torch.randn(3, 6, 2, 8).to(dtype) * 50, torch.randn(3, 2, 2, 8).to(dtype) * 50
    for positions in (torch.tensor([[3, 4], [70, 71], [1000, 1001]]), torch.tensor([5, 6])):
        want = [(m(q, positions), m(k, positions)) for m in want_modules]
        with decode_attention(ropes):
            got = [(m(q, positions), m(k, positions)) for m in ropes]
        for (gq, gk), (wq, wk) in zip(got, want):
            assert torch.equal(gq, wq) and torch.equal(gk, wk)


@pytest.mark.skipif(not build.available(), reason=f"qkv's C++ kernels are not built here: {build.why_not()}")
def test_with_the_kernel_the_keys_are_read_in_place_with_the_reference_answer(monkeypatch):
    """Where qkv's kernel is built, the paged model's writes hand DecodeAttention the pools themselves (no gathered
    copy) and paged_one_query reads each row's blocks where they lie: a decoding row and a folded prompt's rest
    (rows of one table) give the reference attention's logits."""
    import contextlib

    import qkv.generation.paged as paged_module

    returned, step = folded_step(tiny(), monkeypatch)

    fast = step()
    assert all(k.size(0) == 12 for k in returned)  # the pools of 12 blocks, as they are
    monkeypatch.setattr(paged_module, "decode_attention", contextlib.nullcontext)
    reference = step()
    assert all(k.size(0) == 5 for k in returned)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
