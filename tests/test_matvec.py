"""qkv.matvec: qkv's own kernel for a few rows against F.linear (the reference), when qkv.linear takes
it, its errors, and the fallback where it cannot be built."""
import importlib
import time
import warnings
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.kernels import linear as lin
from qkv.kernels import build as matvec

built = pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where they cannot be built


def op_calls(fn) -> int:
    """How many times ``fn()`` calls ``qkv::matvec``."""
    with torch.profiler.profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "qkv::matvec")


@built
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
# dot.h's paths: tails alone, 64 + 16, 64s + a tail, dot16 with rows left over (one row of x), dot16 whole
@pytest.mark.parametrize("n, k", [(1, 1), (7, 5), (5, 80), (33, 130), (37, 128), (512, 512)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_f_linear(rows, n, k, bias):
    w, x = torch.randn(n, k), torch.randn(rows, k)
    b = torch.randn(n) if bias else None
    torch.testing.assert_close(torch.ops.qkv.matvec(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-6 * k)  # fp32 sums of k


@built
@pytest.mark.parametrize("rows", [1, 3])
def test_bf16_sums_in_fp32_and_rounds_once(rows):
    """bf16 operands: the fp32 product of the same numbers, rounded to bf16 once, as F.linear's."""
    w, x, b = (torch.randn(shape).bfloat16() for shape in ((300, 257), (rows, 257), (300,)))
    got = torch.ops.qkv.matvec(x, w, b)
    assert got.dtype == torch.bfloat16
    want = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-5 * 257)  # bf16 keeps 8 bits
    torch.testing.assert_close(got, F.linear(x, w, b))


@built
@pytest.mark.parametrize("shape", [(5,), (1, 5), (1, 1, 5), (2, 1, 5), (2, 2, 0)])
def test_keeps_the_leading_dimensions(shape):
    w, x, b = torch.randn(3, shape[-1]), torch.randn(shape), torch.randn(3)
    got = torch.ops.qkv.matvec(x, w, b)
    assert got.shape == (*shape[:-1], 3)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@built
def test_every_thread_count_gives_the_same_bits():
    """Each output is one thread's sum in one order, however the rows are split among threads."""
    w, x = torch.randn(4099, 256), torch.randn(2, 256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.qkv.matvec(x, w, None)
        torch.set_num_threads(max(2, before))
        assert torch.equal(torch.ops.qkv.matvec(x, w, None), one)
    finally:
        torch.set_num_threads(before)


@built
@pytest.mark.parametrize("args, message", [
    ((torch.randn(8), torch.randn(3, 7), None), r"x must be \(\.\.\., 7\) for a weight of \[3, 7\], got \[8\]"),
    ((torch.randn(7), torch.randn(3, 7, 1), None), r"weight must be \(N, K\), got \[3, 7, 1\]"),
    ((torch.randn(7).double(), torch.randn(3, 7).double(), None), "expected float32 or bfloat16 x and weight of one "
                                                                  "dtype, got Double and Double"),
    ((torch.randn(7), torch.randn(3, 7).bfloat16(), None), "of one dtype, got Float and BFloat16"),
    ((torch.randn(7), torch.randn(3, 7), torch.randn(4)), r"bias must be contiguous Float \(3,\), got Float \[4\]"),
    ((torch.randn(7), torch.randn(7, 3).t(), None), "expected contiguous CPU tensors"),
])
def test_bad_input_names_expected_and_actual(args, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.qkv.matvec(*args)


@built
def test_fake_and_schema_for_compile():
    x, w, b = torch.randn(1, 1, 6), torch.randn(5, 6), torch.randn(5)
    torch.library.opcheck(torch.ops.qkv.matvec.default, (x, w, b), test_utils=("test_schema", "test_faketensor"))


@built
def test_linear_takes_it_for_a_few_rows_at_inference_only():
    layer = lin.KernelLinear(6, 5)
    with torch.no_grad():
        for rows in range(1, matvec.MAX_ROWS + 1):
            assert op_calls(lambda: layer(torch.randn(rows, 6))) == 1
        assert op_calls(lambda: layer(torch.randn(matvec.MAX_ROWS + 1, 6))) == 0
        assert op_calls(lambda: layer(torch.randn(1, 12)[:, ::2])) == 0  # strided: the reference
        assert op_calls(lambda: layer.bfloat16()(torch.randn(1, 6, dtype=torch.bfloat16))) == 1
        with pytest.raises(RuntimeError, match="same dtype"):  # fp32 input, bf16 weights: F.linear's error
            layer(torch.randn(1, 6))
        assert op_calls(lambda: layer.double()(torch.randn(1, 6, dtype=torch.float64))) == 0
    x = torch.randn(1, 6, requires_grad=True)
    layer.float()
    assert op_calls(lambda: layer(x).sum().backward()) == 0  # autograd: F.linear
    torch.testing.assert_close(x.grad, layer.weight.sum(0, keepdim=True))


@built
def test_compiled_linear_calls_it_from_two_rows():
    """One row stays inductor's fused reduction (tests/test_linear.py); two to MAX_ROWS call the kernel."""
    layer = lin.KernelLinear(6, 5).eval()
    names = []

    def backend(gm, example_inputs):
        names.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    x = torch.randn(1, 2, 6)
    with torch.no_grad():
        got = torch.compile(layer, backend=backend, fullgraph=True)(x)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    assert "qkv.matvec" in names, names


@built
@pytest.mark.parametrize("compile", [False, "inductor"])
def test_greedy_tokens_equal_the_reference_path(monkeypatch, compile):
    """Batch 1 and a batch of 3 (through the kernel, eagerly; compiled, the batch of 3, and at batch 1
    only the prefill's LM head, one row for the last position, which runs eagerly) against every product
    through F.linear."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")  # capture only
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "auto_fuses", lambda m, b: False)  # forward
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", attention=dict(num_heads=2), vocab_size=61)).eval()
    for batch in (1, 3):
        ids = torch.randint(0, 61, (batch, 5), generator=torch.Generator().manual_seed(batch))
        calls = op_calls(lambda: model.generate(ids, 3, temperature=0, compile=compile))
        assert calls > 0 if batch > 1 or not compile else calls == 1
        got = model.generate(ids, 12, temperature=0, compile=compile)
        with mock.patch.object(lin, "linear", side_effect=lambda x, w, b=None, packed=None: F.linear(x, w, b)):
            want = model.generate(ids, 12, temperature=0)
        assert torch.equal(got, want)


def test_flop_counter_counts_it():
    from torch.utils.flop_counter import FlopCounterMode

    layer = lin.KernelLinear(5, 7)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(torch.randn(2, 5))
    assert counter.get_total_flops() == 2 * 2 * 7 * 5


def test_off_or_unbuildable_falls_back_with_a_warning(monkeypatch, tmp_path):
    """QKV_MATVEC=0 is quiet; a failed build warns once and qkv.linear keeps the reference's results
    (tests/test_kernel_build.py: what the failure leaves behind, the platforms not attempted)."""
    monkeypatch.setattr(matvec, "WHY_NOT", matvec.WHY_NOT)
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))  # the failure's marker goes there, not in the real cache
    monkeypatch.setenv("QKV_MATVEC", "0")
    monkeypatch.setattr(matvec, "LOADED", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matvec.available() is False
    assert matvec.why_not() == "QKV_MATVEC=0 turns them off"
    monkeypatch.delenv("QKV_MATVEC")
    monkeypatch.setattr(matvec, "LOADED", None)
    monkeypatch.setattr(matvec, "not_for_this_machine", lambda: "")  # a machine it is built for,
    monkeypatch.setattr(matvec, "missing_tools", lambda: "")  # with the tools, whatever runs the test
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "load", mock.Mock(side_effect=RuntimeError("Error building extension")))
    with pytest.warns(RuntimeWarning, match=r"could not build its C\+\+ kernels: the build failed \(RuntimeError: "
                      "Error building"):
        assert matvec.available() is False
    layer, x = lin.KernelLinear(5, 7), torch.randn(1, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not per call
        with torch.no_grad():
            assert op_calls(lambda: layer(x)) == 0
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_build_folder_follows_the_cache_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    assert matvec.build_folder().parent == tmp_path / "kernels"
    assert matvec.failure_marker().parent == matvec.build_folder()  # a failed build is remembered beside it
    monkeypatch.setenv("QKV_CACHE_DIR", "off")
    assert tmp_path not in matvec.build_folder().parents
    assert matvec.build_name().startswith("qkv_matvec_")


def test_threads_asking_at_once_build_and_register_once(monkeypatch):
    """The first products may come from several threads (a server, a data loader): one load, one answer."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(matvec, "LOADED", None)
    calls = []

    def slow_load():
        calls.append(1)
        time.sleep(0.05)  # a build takes seconds: without the lock every thread would start one
        return False

    monkeypatch.setattr(matvec, "load", slow_load)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: matvec.available(), range(8)))
    assert answers == [False] * 8 and len(calls) == 1
