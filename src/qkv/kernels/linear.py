"""The speed layer's linear product: ``F.linear`` at inference on a CPU, through the fastest kernel for its shape.

    y = x Wᵀ + b      x (..., K), W (N, K), b (N,)

Decoding one token at batch 1 is one matrix-vector product per weight, so its speed is the rate at which
the weights stream from memory. ``F.linear`` (MKL in PyTorch's CPU builds) computes such a product on one
core, and more rows slower than oneDNN (docs/speed.md has the measurements), so:

- under ``torch.compile``, one row: the product written as the reduction it is, ``(W * x).sum(-1)``,
  which inductor fuses with its neighbours into one vectorised pass over W on every core (``reduction_matvec``);
- up to ``MAX_ROWS`` rows (batch-1 decoding, a small beam), eager, and compiled from two rows: qkv's own
  kernel, ``torch.ops.qkv.matvec``, which reads each weight in one pass (``qkv.kernels.build``: built once per
  machine where it can run and pays; elsewhere the paths below serve);
- more rows: oneDNN's inner product, which PyTorch ships and inductor's CPU fusions call
  (``onednn_linear``), under compile kept opaque (``compiled_onednn_linear``); inside ``packed_weights`` (a
  server's steps of many rows) on a copy of the weight in oneDNN's blocked layout, made once, in fp32 and in
  bf16 where the CPU computes it natively: the same sums, without re-blocking the weight at every call.

``F.linear`` is the reference: autograd (training), autocast (which casts the weights inside it), tensor
subclasses (torchao's quantised weights, ``qkv.kernels.quant``, whose product is their own), other dtypes,
small weights (where oneDNN's call costs more than the product), other devices and builds without oneDNN go
through it; the tests check every fast path against it.
Shapes: K input width, N output width, M rows.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import flop_counter

from ..runtime import native_bf16
from . import build as matvec
from .build import linear_flops, linear_shape

ONEDNN = torch.backends.mkldnn.is_available()  # every official x86-64 and arm64 CPU build
# oneDNN's call costs several times MKL's: below 512 × 512 weights (1 MB in fp32) MKL's is the faster one.
ONEDNN_MIN_WEIGHT = 1 << 18
# Rows from which a packed weight is read: past qkv's kernel's rows (and from 3 rows, fp32's packed sums equal
# the unpacked call's bit for bit; tests/test_linear.py).
PACK_MIN_ROWS = max(matvec.MAX_ROWS + 1, 3)


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) -> (..., N), fp32, through oneDNN's inner product on the weight as it is (no copy)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@torch.library.custom_op("qkv::onednn_linear", mutates_args=())
def compiled_onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``onednn_linear`` as an opaque op for ``torch.compile``, which calls it as it is (inductor's own
    lowering of the oneDNN op fails here); eagerly the plain call is cheaper than a custom op's dispatch."""
    return onednn_linear(x, weight, bias)


compiled_onednn_linear.register_fake(linear_shape)


for op in (torch.ops.mkldnn._linear_pointwise, torch.ops.qkv.onednn_linear) if ONEDNN else ():
    if op not in flop_counter.flop_registry:  # a later torch may count it itself
        flop_counter.register_flop_formula(op)(linear_flops)


def reduction_matvec(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) holding one row -> (..., N) as Σ_k W[n, k] x[k]: for inductor to fuse, never eager
    (eagerly it would materialise the whole (N, K) product)."""
    y = (weight * x.reshape(1, -1)).sum(-1)  # (N,)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.size(0))


def plain_tensor(t: Tensor | None) -> bool:
    """``t`` is a plain tensor or parameter (or None), not a subclass such as torchao's quantised ``Int8Tensor``,
    whose product only its own ``F.linear`` computes: the kernels here read plain memory."""
    return t is None or type(t) in (Tensor, nn.Parameter)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the fast paths above at inference on a CPU; ``packed``: the
    weight in oneDNN's blocked layout (``packed_weights``), read from PACK_MIN_ROWS rows on."""
    if not x.is_cpu or not x.numel() or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)
    if not (plain_tensor(weight) and plain_tensor(bias)):  # a quantised weight: its own product
        return F.linear(x, weight, bias)
    compiling = torch.compiler.is_compiling()
    dense = weight.dtype == x.dtype and weight.is_contiguous() and x.is_contiguous() and (
        bias is None or bias.dtype == x.dtype and bias.is_contiguous())
    if compiling and x.numel() == weight.size(1):  # one row: inductor fuses it with its neighbours
        return reduction_matvec(x, weight, bias)
    if (dense and x.dtype in matvec.DTYPES and x.numel() <= matvec.MAX_ROWS * weight.size(1)
            and (matvec.LOADED if compiling else matvec.available())):
        return torch.ops.qkv.matvec(x, weight, bias)  # a few rows: qkv's own kernel, where it is built
    if (packed is not None and dense and not compiling and x.dtype == packed.dtype
            and x.numel() >= PACK_MIN_ROWS * weight.size(1)):
        return onednn_linear(x, packed, bias)  # many rows on the weight blocked once
    plain = dense and x.dtype == torch.float32
    if not plain or not ONEDNN or weight.numel() < ONEDNN_MIN_WEIGHT:  # oneDNN takes no strided operands
        return F.linear(x, weight, bias)
    return (compiled_onednn_linear if compiling else onednn_linear)(x, weight, bias)


class KernelLinear(nn.Linear):
    """``nn.Linear`` (same parameters, names and state dict) whose product goes through ``linear``'s fast paths.

    ``qkv.kernels.accelerate`` turns a model's plain ``nn.Linear`` layers into these for inference; anything
    ``linear`` was not built for (autograd, autocast, other devices) is ``F.linear``'s as before.
    """

    packed: Tensor | None = None  # the weight in oneDNN's layout, inside ``packed_weights``
    packed_version = -1  # the weight's version when packed: a weight changed since is read as it is

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        if self.packed is not None and self.weight._version == self.packed_version:
            return linear(x, self.weight, self.bias, packed=self.packed)
        return linear(x, self.weight, self.bias)


def packable(m: nn.Module) -> bool:
    """A ``KernelLinear`` whose many-row products oneDNN computes on a packed weight with the same sums: on a
    CPU, plain and contiguous, large enough, fp32 or bf16 where the CPU computes bf16 natively."""
    if not (isinstance(m, KernelLinear) and ONEDNN and m.weight.is_cpu and plain_tensor(m.weight)
            and plain_tensor(m.bias) and m.weight.is_contiguous() and m.weight.numel() >= ONEDNN_MIN_WEIGHT):
        return False
    dtype = m.weight.dtype
    return (dtype == torch.float32 or dtype == torch.bfloat16 and native_bf16("cpu")) and (
        m.bias is None or m.bias.dtype == dtype)


def blocked(weight: Tensor, rows: int) -> Tensor:
    """``weight`` (N, K) in oneDNN's blocked layout for products of about ``rows`` rows (``onednn_linear``'s)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


@contextmanager
def packed_weights(model: nn.Module, rows: int = 16) -> Iterator[int]:
    """Inside: every packable linear of ``model`` (after ``accelerate``) also holds its weight in oneDNN's
    blocked layout for about ``rows`` rows (one more copy of those weights) -> how many were packed."""
    layers = []
    for m in (m for m in model.modules() if packable(m)):
        try:
            m.packed = blocked(m.weight.detach(), rows)
        except RuntimeError as e:  # a CPU or oneDNN build that cannot block it: its products stay as they were
            warnings.warn(f"qkv: a {tuple(m.weight.shape)} {m.weight.dtype} weight is read unblocked: {e}",
                          stacklevel=3)
            continue
        m.packed_version = m.weight._version
        layers.append(m)
    try:
        yield len(layers)
    finally:
        for m in layers:
            del m.packed, m.packed_version
