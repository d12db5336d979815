import math

import pytest
import torch

import qkv


def test_sinusoidal_is_the_papers_formula():
    pe = qkv.SinusoidalPositionalEncoding(8)(5)
    for pos in range(5):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_bounded_any_length_and_offset():
    enc = qkv.SinusoidalPositionalEncoding(16)
    pe = enc(5000)
    assert pe.shape == (5000, 16) and pe.abs().max() <= 1.0
    torch.testing.assert_close(enc(torch.arange(10, 15)), pe[10:15])
    assert enc(torch.tensor([[1, 2], [3, 4]])).shape == (2, 2, 16)


def test_sinusoidal_shift_is_a_fixed_block_rotation():
    enc, k = qkv.SinusoidalPositionalEncoding(8), 7
    pe = enc(40).double()
    theta = k * enc.inv_freq.double()  # (4,)
    # rotation on each (sin, cos) pair: [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] [sin a, cos a]
    R = torch.zeros(8, 8, dtype=torch.float64)
    for i, t in enumerate(theta):
        R[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])
    torch.testing.assert_close(pe[:-k] @ R.T, pe[k:], atol=1e-5, rtol=0)


def test_learned_embedding_refuses_positions_past_max_len():
    emb = qkv.LearnedPositionalEmbedding(4, 8)
    assert emb(4).shape == (4, 8)
    with pytest.raises(ValueError, match=r"position 4 .*max_len=4"):
        emb(5)
    with pytest.raises(ValueError, match="max_len"):
        qkv.LearnedPositionalEmbedding(0, 8)


def test_rope_preserves_norm_and_depends_on_relative_position():
    rope = qkv.RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def score(m, n):
        return (rope(q, m) * rope(k, n)).sum().item()
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    x = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rope(x)[..., 0, :], x[..., 0, :])  # position 0 is the identity


def test_rope_positions_equal_slice_of_full():
    rope = qkv.RotaryEmbedding(8)
    x = torch.randn(2, 2, 6, 8)
    want = rope(x)[:, :, 4:]
    for positions in (4, torch.tensor(4), torch.tensor([4, 5]), torch.tensor([[4, 5], [4, 5]])):
        torch.testing.assert_close(rope(x[:, :, 4:], positions=positions), want)
    per_row = rope(x[:, :, 4:], torch.tensor([[4, 5], [0, 1]]))  # (B, T): each row its own positions
    torch.testing.assert_close(per_row[0], want[0])
    torch.testing.assert_close(per_row[1], rope(x[1:, :, 4:])[0])  # positions 0, 1


def test_rope_bad_positions_are_refused():
    rope, x = qkv.RotaryEmbedding(8), torch.randn(2, 1, 3, 8)
    with pytest.raises(ValueError, match=r"\(T=3,\) or \(B=2, T=3\), got \(4,\)"):
        rope(x, torch.arange(4))
    with pytest.raises(TypeError, match="integer"):
        rope(x, torch.zeros(3))


def test_positions_have_one_keyword():
    rope, alibi = qkv.RotaryEmbedding(8), qkv.ALiBi(2)
    x = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match="offset"):
        rope(x, offset=5)
    with pytest.raises(TypeError, match="q_positions"):
        alibi(2, 6, q_positions=torch.tensor([1, 4]))


def test_rope_interleaved_equals_half_split_after_permuting_features():
    half, inter = qkv.RotaryEmbedding(8), qkv.RotaryEmbedding(8, interleaved=True)
    x = torch.randn(1, 1, 5, 8)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # interleaved pair i = (2i, 2i+1) -> half-split (i, i+4)
    torch.testing.assert_close(inter(x)[..., perm], half(x[..., perm]))


def test_rope_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="even"):
        qkv.RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"\(B, H, T, 8\)"):
        qkv.RotaryEmbedding(8)(torch.randn(2, 3, 4))


def test_alibi_slopes_follow_press_et_al():
    assert qkv.ALiBi(8).slopes.tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads
    four = [2 ** (-2 * (i + 1)) for i in range(4)]
    eight = [2 ** -(i + 1) for i in range(8)]
    assert qkv.ALiBi(6).slopes.tolist() == pytest.approx(four + eight[0::2][:2])


def test_alibi_bias_is_bottom_right_aligned():
    alibi = qkv.ALiBi(2)
    bias = alibi(2, 4)  # (H, L, S)
    assert bias.shape == (2, 2, 4)
    m = alibi.slopes[0].item()
    # query 1 is at key position 3: distances 3, 2, 1, 0
    assert bias[0, 1].tolist() == pytest.approx([-3 * m, -2 * m, -m, 0])
    torch.testing.assert_close(alibi(4, 4)[:, 2:], bias)
    # explicit positions on the key axis (a static cache of capacity 6): query 1 at key 3 again
    static = alibi(2, 6, positions=torch.tensor([2, 3]))
    torch.testing.assert_close(static[..., :4], bias)
    assert static[0, 1].tolist() == pytest.approx([-3 * m, -2 * m, -m, 0, -m, -2 * m])
    with pytest.raises(ValueError, match=r"\(L=2,\)"):
        alibi(2, 6, positions=torch.tensor([1, 2, 3]))
