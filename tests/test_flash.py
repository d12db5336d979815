"""flash_attention: equal to scaled_dot_product_attention (values and gradients), bad input, O(n) memory."""
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

import qkv

ATOL = 1e-5


def rand(*shape, grad=False):
    return torch.randn(*shape, requires_grad=grad)


def cases(L, S):
    """Keyword sets covering masks (with rows that see nothing), causal, both, and a custom scale."""
    mask = torch.rand(2, 1, L, S) > 0.5
    mask[0, 0, 0] = False  # query 0 of batch 0 may attend to nothing
    return [{}, {"mask": mask}, {"is_causal": True}, {"mask": mask, "is_causal": True}, {"scale": 0.3},
            {"mask": mask[0, 0, :, :1].expand(L, S).clone()}]  # (L, S) mask, broadcast over (B, H)


# --- equivalence ----------------------------------------------------------------------


@pytest.mark.parametrize("L,S,block_size", [(5, 5, 2), (3, 7, 4), (9, 4, 4), (17, 33, 8), (33, 17, 8), (8, 8, 64)])
def test_equals_sdpa(L, S, block_size):
    q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 6)
    for kw in cases(L, S):
        out = qkv.flash_attention(q, k, v, block_size=block_size, **kw)
        expected = qkv.scaled_dot_product_attention(q, k, v, **kw)
        assert out.shape == (2, 3, L, 6)
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_row_with_no_key_is_zero_not_nan():
    q, k, v = rand(1, 4, 8), rand(1, 6, 8), rand(1, 6, 5)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out = qkv.flash_attention(q, k, v, mask=mask, block_size=4)
    assert torch.equal(out[0, 2], torch.zeros(5)) and not out.isnan().any()
    # more queries than keys, causal bottom-right: queries 0 and 1 of 4 see nothing over 2 keys
    out = qkv.flash_attention(q, k[:, :2], v[:, :2], is_causal=True, block_size=3)
    assert torch.equal(out[0, :2], torch.zeros(2, 5)) and (out[0, 2:] != 0).all()


def test_large_scores_do_not_overflow():
    q, k, v = rand(1, 6, 4) * 100, rand(1, 6, 4) * 100, rand(1, 6, 3)
    out = qkv.flash_attention(q, k, v, block_size=2)
    torch.testing.assert_close(out, qkv.scaled_dot_product_attention(q, k, v), atol=ATOL, rtol=0)


def test_half_precision_keeps_dtype():
    q, k, v = (rand(2, 10, 8).to(torch.bfloat16) for _ in range(3))
    out = qkv.flash_attention(q, k, v, is_causal=True, block_size=4)
    expected = qkv.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=0)


@pytest.mark.parametrize("L,S", [(6, 6), (4, 9), (9, 4)])
def test_gradients_equal_sdpa(L, S):
    mask = torch.rand(2, 1, L, S) > 0.4
    mask[1, 0, -1] = False  # a dead row: its gradients must be zero, not NaN
    for kw in ({"is_causal": True}, {"mask": mask}, {"mask": mask, "is_causal": True}):
        grads = []
        for attend in (qkv.scaled_dot_product_attention, lambda *a, **k: qkv.flash_attention(*a, block_size=4, **k)):
            torch.manual_seed(1)
            q, k, v = rand(2, 2, L, 8, grad=True), rand(2, 2, S, 8, grad=True), rand(2, 2, S, 5, grad=True)
            (attend(q, k, v, **kw) * torch.randn(2, 2, L, 5)).sum().backward()
            grads.append((q.grad, k.grad, v.grad))
        for ours, theirs in zip(*grads):
            assert not ours.isnan().any()
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


# --- causal block skipping ------------------------------------------------------------


def test_causal_skips_hidden_key_blocks():
    # 8 × 8 tiles of 8 × 8; causal keeps the 36 on or below the diagonal. Each tile costs
    # 2·8·8·D (scores) + 2·8·8·Dv (P V) FLOPs; FlopCounterMode counts matmuls only.
    q, k, v = rand(1, 64, 4), rand(1, 64, 4), rand(1, 64, 4)
    flops = {}
    for causal in (False, True):
        with FlopCounterMode(display=False) as counter:
            qkv.flash_attention(q, k, v, is_causal=causal, block_size=8)
        flops[causal] = counter.get_total_flops()
    assert flops[False] == 64 * (2 * 8 * 8 * 4) * 2
    assert flops[True] == 36 * (2 * 8 * 8 * 4) * 2


# --- memory: O(n) for flash, O(n²) for the reference path -----------------------------


class PeakLiveBytes(TorchDispatchMode):
    """Peak bytes of the storages allocated by aten ops while active and still alive at once.

    Sees every aten op, also those inside composite functions. A storage counts from the op
    that creates it until Python frees it; views and in-place results reuse an input's storage
    and are not counted again.
    """

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.tracked = 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in inputs or key in self.tracked or storage.nbytes() == 0:
                continue
            self.tracked.add(key)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self.free, key, storage.nbytes())
        return out

    def free(self, key, nbytes):
        self.tracked.discard(key)
        self.live -= nbytes


def peak_bytes(fn, n):
    q, k, v = rand(1, 2, n, 16), rand(1, 2, n, 16), rand(1, 2, n, 16)
    with torch.no_grad(), PeakLiveBytes() as tracker:
        fn(q, k, v)
    return tracker.peak


def test_peak_memory_grows_linearly_for_flash_and_quadratically_for_reference():
    reference = lambda q, k, v: qkv.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)  # noqa: E731
    flash = lambda q, k, v: qkv.flash_attention(q, k, v, is_causal=True, block_size=32)  # noqa: E731
    ref = [peak_bytes(reference, n) for n in (128, 256)]
    fl = [peak_bytes(flash, n) for n in (128, 256)]
    scores = 2 * 256 * 256 * 4  # one (B, H, n, n) fp32 tensor at n = 256
    assert ref[1] >= scores and ref[1] / ref[0] > 3.5  # n doubled: ~4x
    assert fl[1] < scores / 4 and fl[1] / fl[0] < 2.5  # n doubled: ~2x


def test_peak_tracker_counts_live_storages():
    with torch.no_grad(), PeakLiveBytes() as tracker:
        a = torch.zeros(100)  # 400 bytes
        b = a[10:] + 1  # the view is free, the sum 360 bytes
        del a, b
        torch.zeros(50)  # 200 bytes once the others are gone
    assert tracker.peak == 760 and tracker.live == 0


# --- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("args,kw,error,match", [
    ((rand(4), rand(4, 8), rand(4, 8)), {}, ValueError, r"q must have shape \(\.\.\., len, dim\), got shape \(4,\)"),
    ((rand(2, 4, 8), rand(2, 5, 6), rand(2, 5, 3)), {}, ValueError, r"share their last dim.*q \(2, 4, 8\), k \(2, 5, 6\)"),
    ((rand(2, 4, 8), rand(2, 5, 8), rand(2, 6, 3)), {}, ValueError, r"same length.*k \(2, 5, 8\), v \(2, 6, 3\)"),
    ((rand(2, 4, 8), rand(3, 5, 8), rand(3, 5, 3)), {}, ValueError, r"leading dims.*q \(2, 4, 8\), k \(3, 5, 8\)"),
    ((torch.ones(4, 8, dtype=torch.long), rand(5, 8), rand(5, 3)), {}, TypeError, r"q must be a floating-point.*int64"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"mask": torch.ones(4, 5)}, TypeError, r"bool Tensor.*float32"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"mask": torch.ones(4, 6, dtype=torch.bool)}, ValueError,
     r"mask of shape \(4, 6\) does not broadcast to the scores' shape \(4, 5\)"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"mask": torch.ones(2, 4, 5, dtype=torch.bool)}, ValueError,
     r"mask of shape \(2, 4, 5\)"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"block_size": 0}, ValueError, r"block_size must be a positive int, got 0"),
    ((rand(4, 8), rand(5, 8), rand(5, 3)), {"block_size": 2.0}, ValueError, r"got 2\.0"),
])
def test_bad_input(args, kw, error, match):
    with pytest.raises(error, match=match):
        qkv.flash_attention(*args, **kw)
