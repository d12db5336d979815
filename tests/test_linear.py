"""qkv.linear: the inference fast paths against F.linear (the reference), and when each is taken."""
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv import linear as lin
from qkv import matvec
from qkv.linear import Linear, onednn_linear, reduction_matvec

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
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", num_heads=2, vocab_size=61)).eval()
    ids = torch.randint(0, 61, (2, 5))
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


# --- q, k and v laid end to end: one product at inference -------------------------------------------

def _mha(**kw) -> qkv.MultiHeadAttention:
    torch.manual_seed(0)
    return qkv.MultiHeadAttention(16, 4, bias=True, **kw).eval()


def _separately(m, x):
    """The three projections as three F.linear calls, heads split: the reference for the packed product."""
    return [F.linear(x, p.weight, p.bias) for p in (m.q_proj, m.k_proj, m.v_proj)]


@pytest.mark.parametrize("kw", [{}, {"num_kv_heads": 2}])
def test_projections_lie_end_to_end_and_are_read_as_one_product(kw, fast):
    m, x = _mha(**kw), torch.randn(2, 3, 16)
    block = lin.end_to_end(m.q_proj, m.k_proj, m.v_proj)
    assert block is None  # grad mode with trainable weights: three products, each its own leaf
    with torch.no_grad():
        weight, bias = lin.end_to_end(m.q_proj, m.k_proj, m.v_proj)
        assert torch.equal(weight, torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        assert torch.equal(bias, torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        assert weight.data_ptr() == m.q_proj.weight.data_ptr()  # a view, no copy
        got = m(x)
    assert fast.call_count == 2  # q, k, v as one product, then out_proj
    with torch.enable_grad():
        torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-6)  # three F.linear calls


def test_frozen_projections_read_as_one_product_pass_the_input_its_gradient(fast):
    m, x = _mha(), torch.randn(1, 2, 16, requires_grad=True)
    m.requires_grad_(False)  # frozen weights, gradient wanted for the input (attribution)
    with torch.inference_mode():  # the views, remembered under inference_mode, then used with autograd
        assert lin.end_to_end(m.q_proj, m.k_proj, m.v_proj) is not None
    m(x).sum().backward()
    with torch.no_grad():
        want = torch.autograd.functional.jacobian(lambda t: m(t).sum(), x.detach())
    torch.testing.assert_close(x.grad, want, rtol=1e-4, atol=1e-5)


def test_moved_replaced_or_hooked_projections_are_read_one_by_one(fast):
    m, x = _mha(), torch.randn(1, 2, 16)
    with torch.no_grad():
        assert lin.end_to_end(m.q_proj, m.k_proj, m.v_proj) is not None  # found, and remembered
        m.k_proj.weight.data = m.k_proj.weight.data.clone() * 2  # new memory, out of the block
        assert lin.end_to_end(m.q_proj, m.k_proj, m.v_proj) is None
        q, k, v = _separately(m, x)
        torch.testing.assert_close(m._project(x, None, None)[1], m._heads(k, 4))  # the new weight is the one read
        m._lay_projections()
        assert lin.end_to_end(m.q_proj, m.k_proj, m.v_proj) is not None
        seen = []
        handle = m.q_proj.register_forward_hook(lambda mod, args, out: seen.append(out))
        m(x)
        handle.remove()
    assert len(seen) == 1  # a hook on q_proj still sees q_proj's own call


def test_to_and_deepcopy_lay_the_parameters_again():
    import copy

    m = _mha()
    params = [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]
    m.to(torch.float64)
    assert [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight] == params  # same objects: optimisers keep them
    twin = copy.deepcopy(m)
    with torch.no_grad():
        assert lin.end_to_end(m.q_proj, m.k_proj, m.v_proj)[0].dtype == torch.float64
        weight, _ = lin.end_to_end(twin.q_proj, twin.k_proj, twin.v_proj)
        assert weight.data_ptr() != m.q_proj.weight.data_ptr()  # its own block
        x = torch.randn(1, 3, 16, dtype=torch.float64)
        assert torch.equal(twin(x), m(x))


def test_state_dict_holds_separate_tensors_that_safetensors_saves(tmp_path):
    from safetensors.torch import load_file, save_file, save_model

    m = _mha()
    state = m.state_dict()
    assert state.keys() == {f"{p}_proj.{w}" for p in "qkvo" if p != "o" for w in ("weight", "bias")} | \
        {"out_proj.weight", "out_proj.bias"}
    assert len({t.untyped_storage().data_ptr() for t in state.values()}) == len(state)  # no shared memory
    save_file(state, tmp_path / "a.safetensors")
    save_model(m, tmp_path / "b.safetensors")
    fresh = qkv.MultiHeadAttention(16, 4, bias=True)
    fresh.load_state_dict(load_file(tmp_path / "a.safetensors"))  # copied into the block: still one product
    with torch.no_grad():
        assert lin.end_to_end(fresh.q_proj, fresh.k_proj, fresh.v_proj) is not None
        x = torch.randn(1, 3, 16)
        assert torch.equal(fresh(x), m.eval()(x))


def test_cross_attention_projects_keys_and_values_as_one_product(fast):
    m, ctx = qkv.MultiHeadAttention(16, 4, kv_dim=12).eval(), torch.randn(2, 5, 12)
    with torch.no_grad():
        k, v = m.project_kv(ctx)
        assert fast.call_count == 1
        torch.testing.assert_close(k, m._heads(F.linear(ctx, m.k_proj.weight), 4))
        torch.testing.assert_close(v, m._heads(F.linear(ctx, m.v_proj.weight), 4))
