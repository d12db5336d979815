"""qkv.linear: the one-row fast paths against F.linear (the reference), and when each is taken."""
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv import linear as lin
from qkv.linear import Linear, reduction_matvec, threaded_matvec


def _layer(n: int, k: int, bias: bool = True) -> Linear:
    return Linear(k, n, bias=bias)


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(8, 4), (12, 5), (7, 6), (1, 3), (3, 8)])  # 7 and 1 rows leave remainders
@pytest.mark.parametrize("bias", [True, False])
def test_threaded_matvec_equals_f_linear(parts, n, k, bias):
    layer = _layer(n, k, bias)
    for shape in [(k,), (1, k), (1, 1, k)]:
        x = torch.randn(shape)
        with torch.no_grad():
            got, want = threaded_matvec(x, layer.weight, layer.bias, parts), F.linear(x, layer.weight, layer.bias)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_reduction_matvec_equals_f_linear(bias):
    layer = _layer(10, 6, bias)
    x = torch.randn(1, 1, 6)
    with torch.no_grad():
        torch.testing.assert_close(reduction_matvec(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias))


def test_non_contiguous_weight_falls_back_to_f_linear():
    w = torch.randn(6, 8).t()  # (8, 6) with column-major strides
    x = torch.randn(1, 6)
    with torch.no_grad():
        assert torch.equal(threaded_matvec(x, w, None, 2), F.linear(x, w))


def test_fast_path_only_for_one_row_at_inference():
    layer = _layer(8, 4)
    with mock.patch.object(lin, "threaded_matvec", wraps=threaded_matvec) as fast:
        with torch.no_grad():
            layer(torch.randn(2, 4))  # two rows: F.linear
            layer(torch.randn(0, 4))  # no row
        assert fast.call_count == 0
        x = torch.randn(1, 4, requires_grad=True)
        y = layer(x)  # autograd on: F.linear, gradients as nn.Linear's
        assert fast.call_count == 0
        y.sum().backward()
        torch.testing.assert_close(x.grad, layer.weight.sum(0, keepdim=True))
        with torch.inference_mode():
            layer(torch.randn(1, 1, 4))
        assert fast.call_count == 1


def test_linear_is_an_nn_linear_with_its_names():
    layer = _layer(5, 3)
    ref = torch.nn.Linear(3, 5)
    assert isinstance(layer, torch.nn.Linear)
    assert layer.state_dict().keys() == ref.state_dict().keys()
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), ref(x))


def test_under_compile_the_reduction_form_is_traced():
    layer = _layer(8, 4).eval()
    traced = []

    def backend(gm, example_inputs):  # record what dynamo captured, run it as is
        traced.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    x = torch.randn(1, 1, 4)
    with torch.no_grad():
        got = torch.compile(layer, backend=backend, fullgraph=True)(x)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    assert "sum" in traced and not any("linear" in t for t in traced), traced


@pytest.mark.parametrize("threads", [2, 3])
def test_greedy_tokens_with_any_thread_count_equal_the_reference(threads, seed):
    """One thread takes F.linear throughout (the reference); two and three split the products."""
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", num_heads=2, vocab_size=61)).eval()  # 61: uneven split
    ids = torch.randint(0, 61, (1, 5))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = model.generate(ids, 12, temperature=0)
        torch.set_num_threads(threads)
        with mock.patch.object(lin, "threaded_matvec", wraps=threaded_matvec) as fast:
            got = model.generate(ids, 12, temperature=0)
    finally:
        torch.set_num_threads(before)
    assert fast.call_count > 0
    assert torch.equal(got, want)


def test_autocast_and_bf16_weights_keep_f_linear():
    """Autocast casts (and caches) the weights inside F.linear; a bf16 product goes to oneDNN, threaded already."""
    layer = _layer(8, 4)
    with mock.patch.object(lin, "threaded_matvec", wraps=threaded_matvec) as fast, torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(torch.randn(1, 4)).dtype == torch.bfloat16
        layer.bfloat16()(torch.randn(1, 4, dtype=torch.bfloat16))
    assert fast.call_count == 0
