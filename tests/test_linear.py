"""qkv.kernels.linear: the inference fast paths against F.linear (the reference), and when each is taken."""
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.generation import backends
from qkv.kernels import linear as lin
from qkv.kernels import build as matvec
from qkv.kernels.linear import KernelLinear as Linear, onednn_linear, reduction_matvec

# Only the tests that run oneDNN's own kernel need it; where it is missing, test_without_onednn_* checks
# that every product is F.linear's, and the dispatch tests run with a stand-in for the kernel.
needs_onednn = pytest.mark.skipif(not lin.ONEDNN, reason="this PyTorch build has no oneDNN (torch.backends.mkldnn); "
                                                         "qkv then computes every product with F.linear")


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """oneDNN for every weight (by default only from 512 × 512 up), so tiny shapes exercise it; qkv's own
    kernel for a few rows (tests/test_matvec.py) left out, so that these tests see the paths beside it."""
    monkeypatch.setattr(lin, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(matvec, "LOADED", False)


@pytest.fixture
def fast(monkeypatch) -> mock.Mock:
    """The oneDNN call, recorded: the real kernel where this build has it, F.linear standing in elsewhere,
    so that which products go to it is tested on every build."""
    kernel = onednn_linear if lin.ONEDNN else (lambda x, w, b: F.linear(x, w, b))
    monkeypatch.setattr(lin, "ONEDNN", True)
    recorded = mock.Mock(wraps=kernel)
    monkeypatch.setattr(lin, "onednn_linear", recorded)
    return recorded


def _layer(n: int, k: int, bias: bool = True) -> Linear:
    return Linear(k, n, bias=bias)


@needs_onednn
@pytest.mark.parametrize("shape", [(5,), (1, 5), (1, 1, 5), (3, 5), (2, 7, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_equals_f_linear(shape, bias):
    layer = _layer(7, 5, bias)
    x = torch.randn(shape)
    with torch.no_grad():
        got, want = onednn_linear(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_strided_operands_keep_f_linear(fast):
    w, x = torch.randn(8, 6).t(), torch.randn(8, 3).t()  # (6, 8) and (3, 8), transposed views
    with torch.no_grad():
        assert torch.equal(lin.linear(x, w), F.linear(x, w))
        assert torch.equal(lin.linear(x.contiguous(), w), F.linear(x, w))
    assert fast.call_count == 0


@pytest.mark.parametrize("bias", [True, False])
def test_reduction_matvec_equals_f_linear(bias):
    layer = _layer(10, 6, bias)
    x = torch.randn(1, 1, 6)
    with torch.no_grad():
        torch.testing.assert_close(reduction_matvec(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias))


def test_fast_path_only_at_inference_in_fp32(fast):
    """Autograd, autocast (which casts and caches the weights inside F.linear), bf16 weights (oneDNN's
    already) and empty inputs keep F.linear."""
    layer = _layer(8, 4)
    x = torch.randn(1, 4, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0, keepdim=True))
    with torch.no_grad():
        layer(torch.randn(0, 4))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(torch.randn(1, 4)).dtype == torch.bfloat16
        assert fast.call_count == 0
        layer(torch.randn(3, 4))
        assert fast.call_count == 1
    with torch.inference_mode():
        layer(torch.randn(1, 1, 4))
    assert fast.call_count == 2
    with torch.no_grad():
        layer.bfloat16()(torch.randn(1, 4, dtype=torch.bfloat16))
    assert fast.call_count == 2


def test_small_weights_keep_f_linear(fast, monkeypatch):
    monkeypatch.setattr(lin, "ONEDNN_MIN_WEIGHT", 1 << 18)
    with torch.no_grad():
        _layer(511, 512)(torch.randn(1, 512))
        assert fast.call_count == 0
        _layer(512, 512)(torch.randn(1, 512))
        assert fast.call_count == 1


def test_without_onednn_every_product_is_f_linear(monkeypatch):
    """A PyTorch build without oneDNN: the fast path is never taken, the products are F.linear's exactly."""
    monkeypatch.setattr(lin, "ONEDNN", False)
    layer, x = _layer(7, 5), torch.randn(3, 5)
    with mock.patch.object(lin, "onednn_linear") as kernel, torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    kernel.assert_not_called()


def test_linear_is_an_nn_linear_with_its_names():
    layer = _layer(5, 3)
    ref = torch.nn.Linear(3, 5)
    assert isinstance(layer, torch.nn.Linear)
    assert layer.state_dict().keys() == ref.state_dict().keys()
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), ref(x))


def _traced(layer, x) -> tuple[torch.Tensor, list[str]]:
    """layer(x) through torch.compile, and the names of what dynamo captured."""
    names = []

    def backend(gm, example_inputs):  # record what dynamo captured, run it as is
        names.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    with torch.no_grad():
        return torch.compile(layer, backend=backend, fullgraph=True)(x), names


@pytest.mark.parametrize("rows", [1, 3])
def test_under_compile_one_row_is_a_reduction_and_more_rows_the_opaque_op(rows):
    layer = _layer(8, 4).eval()
    x = torch.randn(1, rows, 4)
    got, names = _traced(layer, x)
    with torch.no_grad():
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    if rows == 1:
        assert "sum" in names and not any("linear" in n for n in names), names
    elif lin.ONEDNN:
        assert "qkv.onednn_linear.default" in names, names


@needs_onednn
def test_greedy_tokens_equal_the_reference_path(monkeypatch):
    """Every product through F.linear (the reference) and through the fast paths: the same tokens."""
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", attention=dict(num_heads=2), vocab_size=61)).eval()
    ids = torch.randint(0, 61, (2, 5))
    monkeypatch.setattr(backends, "auto_fuses", lambda model, batch: False)  # auto's forward, not the fused step
    with mock.patch.object(lin, "onednn_linear", wraps=onednn_linear) as fast:
        got = model.generate(ids, 12, temperature=0)
    assert fast.call_count > 0
    monkeypatch.setattr(lin, "onednn_linear", lambda x, w, b: F.linear(x, w, b))
    assert torch.equal(got, model.generate(ids, 12, temperature=0))


def test_flop_counter_counts_the_fast_path():
    from torch.utils.flop_counter import FlopCounterMode

    layer = _layer(7, 5)
    for grad in (True, False):  # F.linear, then oneDNN
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
            layer(torch.randn(3, 5))
        assert counter.get_total_flops() == 2 * 3 * 7 * 5


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_give_the_unpacked_products_and_are_dropped_on_exit(dtype):
    """Inside packed_weights a many-row product reads oneDNN's blocked copy, bit for bit the product it
    replaces (from PACK_MIN_ROWS rows; fewer rows keep their path); a weight changed meanwhile is read as it is;
    on exit the copy goes."""
    if dtype == torch.bfloat16 and not qkv.runtime.native_bf16("cpu"):
        pytest.skip("oneDNN blocks bf16 weights only on CPUs that compute bf16 natively (AVX-512 BF16, AMX); "
                    "elsewhere qkv packs none, as test_only_packable_linears_are_packed checks")
    torch.manual_seed(0)
    layer = Linear(576, 1024, bias=True).to(dtype).eval()
    xs = [torch.randn(rows, 576, dtype=dtype) for rows in (1, lin.PACK_MIN_ROWS, 16, 33)] + [
        torch.randn(2, 9, 576, dtype=dtype)]
    with torch.no_grad():
        want = [layer(x) for x in xs]
        with lin.packed_weights(torch.nn.Sequential(layer)) as count, \
                mock.patch.object(lin, "onednn_linear", wraps=lin.onednn_linear) as spy:
            assert count == 1 and layer.packed is not None
            assert all(torch.equal(layer(x), w) for x, w in zip(xs, want))
            many = [c.args[1] is layer.packed for c in spy.call_args_list if c.args[0].numel() > 576]
            assert many == [True] * 4 and len(spy.call_args_list) <= 5  # one row: its own path
            layer.weight.mul_(2)  # changed after packing: its products read the weight itself
            assert torch.equal(layer(xs[2]), lin.linear(xs[2], layer.weight, layer.bias))
        assert layer.packed is None and "packed" not in vars(layer)


@needs_onednn
def test_only_packable_linears_are_packed(monkeypatch):
    """Small weights, fp16, bf16 where the CPU emulates it, and plain nn.Linear (no speed layer) keep their
    weights as they are."""
    monkeypatch.setattr(lin, "ONEDNN_MIN_WEIGHT", 1 << 18)  # as it is outside these tests
    model = torch.nn.Sequential(Linear(576, 1024), Linear(16, 16), torch.nn.Linear(576, 1024),
                                Linear(576, 1024).half(), Linear(576, 1024).bfloat16())
    natives = (False, True) if qkv.runtime.native_bf16("cpu") else (False,)  # oneDNN cannot block bf16 elsewhere
    for native in natives:  # bf16: only where the CPU computes it natively
        monkeypatch.setattr(lin, "native_bf16", lambda device: native)
        with lin.packed_weights(model) as count:
            assert [m.packed is not None for m in model if isinstance(m, Linear)] == [True, False, False, native]
            assert count == 1 + native and not hasattr(model[2], "packed")


@needs_onednn
def test_a_weight_onednn_cannot_block_is_read_as_it_was_with_a_warning(monkeypatch):
    """A reorder that fails (a CPU or oneDNN build without that dtype's path) leaves that layer unpacked, says
    so once per layer, and packs the others."""
    model = torch.nn.Sequential(Linear(576, 1024), Linear(576, 1024))
    real = lin.blocked

    def blocked(weight, rows):
        if weight.data_ptr() == model[0].weight.data_ptr():
            raise RuntimeError("no bf16 path on this CPU")
        return real(weight, rows)

    monkeypatch.setattr(lin, "blocked", blocked)
    monkeypatch.setattr(lin, "ONEDNN_MIN_WEIGHT", 1 << 18)
    with pytest.warns(UserWarning, match=r"\(1024, 576\) torch.float32 weight is read unblocked: no bf16 path"):
        with lin.packed_weights(model) as count:
            assert count == 1 and model[0].packed is None and model[1].packed is not None
    assert model[1].packed is None
