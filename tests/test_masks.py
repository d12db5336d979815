import pytest
import torch

import qkv


def test_causal_mask_square_is_lower_triangular():
    assert torch.equal(qkv.causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_bottom_right_for_cached_decoding():
    m = qkv.causal_mask(2, 5)
    # pinned: query i sees keys 0 .. k_len - q_len + i
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert qkv.causal_mask(1, 7).all()


def test_causal_mask_more_queries_than_keys_leaves_early_rows_empty():
    m = qkv.causal_mask(4, 2)
    assert m.tolist() == [[False, False], [False, False], [True, False], [True, True]]


def test_padding_mask_from_lengths_and_from_validity():
    m = qkv.padding_mask(torch.tensor([3, 1]))
    assert m.shape == (2, 1, 1, 3)
    assert m[:, 0, 0].tolist() == [[True, True, True], [True, False, False]]
    assert qkv.padding_mask(torch.tensor([2]), max_len=4)[0, 0, 0].tolist() == [True, True, False, False]
    left = torch.tensor([[False, True, True]])
    assert torch.equal(qkv.padding_mask(left)[0, 0, 0], left[0])


@pytest.mark.parametrize(
    "call,error",
    [
        (lambda: qkv.causal_mask(-1), ValueError),
        (lambda: qkv.causal_mask(2, 1.5), ValueError),
        (lambda: qkv.padding_mask([1, 2]), TypeError),
        (lambda: qkv.padding_mask(torch.tensor([1.0])), ValueError),
        (lambda: qkv.padding_mask(torch.tensor([3]), max_len=2), ValueError),
        (lambda: qkv.padding_mask(torch.tensor([-1])), ValueError),
        (lambda: qkv.padding_mask(torch.ones(2, 2, 2, dtype=torch.bool)), ValueError),
    ],
)
def test_bad_input(call, error):
    with pytest.raises(error):
        call()
