"""``nn.Linear`` whose product at inference on a CPU streams its weight on every core.

    y = x Wᵀ + b      x (..., K), W (N, K), b (N,)

Decoding one token at batch 1 is one matrix-vector product per weight, so its speed is the rate
at which the weights stream from memory. ``F.linear`` (MKL in PyTorch's CPU builds) computes such
a product on one core, and more rows at half of oneDNN's speed (measured on 2 AMD Zen 5 cores: one
row over 128 MB, MKL 25 GB/s, oneDNN 55, a plain read 86; 2 to 1 024 rows, oneDNN 2.0-2.4x MKL), so:

- eager: oneDNN's inner product, which PyTorch ships and inductor's CPU fusions call (``onednn_linear``);
- under ``torch.compile``, one row: the product written as the reduction it is, ``(W * x).sum(-1)``,
  which inductor fuses into one vectorised pass over W on every core (``reduction_matvec``);
  several rows: the oneDNN call, kept opaque (``compiled_onednn_linear``).

``F.linear`` is the reference: autograd (training), autocast (which casts the weights inside it),
other dtypes (bf16 already goes to oneDNN), small weights (where oneDNN's call costs more than the
product), other devices and builds without oneDNN go through it; the tests check the fast paths
against it.
Shapes: K input width, N output width, M rows.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import flop_counter

ONEDNN = torch.backends.mkldnn.is_available()  # every official x86-64 and arm64 CPU build
# oneDNN's call costs ~12 µs, MKL's 2 µs: below 512 × 512 weights (1 MB in fp32) MKL's is faster (measured:
# the demo preset decodes at 1517 tok/s through MKL, 930 through oneDNN; d_model 256 best with this bound).
ONEDNN_MIN_WEIGHT = 1 << 18


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) -> (..., N), fp32, through oneDNN's inner product on the weight as it is (no copy)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@torch.library.custom_op("qkv::onednn_linear", mutates_args=())
def compiled_onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``onednn_linear`` as an opaque op for ``torch.compile``, which calls it as it is (inductor's own
    lowering of the oneDNN op fails here); eagerly the plain call is cheaper than a custom op's dispatch."""
    return onednn_linear(x, weight, bias)


@compiled_onednn_linear.register_fake
def linear_shape(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The output's shape and dtype alone, for compile's fake tensors."""
    return x.new_empty(*x.shape[:-1], weight.size(0))


def linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """2·M·N·K for ``torch.utils.flop_counter``, which knows F.linear's matmul but not the oneDNN op."""
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the fast paths above at inference on a CPU."""
    if not x.is_cpu or not x.numel() or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)
    compiling = torch.compiler.is_compiling()
    if compiling and x.numel() == weight.size(1):
        return reduction_matvec(x, weight, bias)
    plain = weight.dtype == x.dtype == torch.float32 and weight.is_contiguous() and x.is_contiguous()
    if not plain or not ONEDNN or weight.numel() < ONEDNN_MIN_WEIGHT:  # oneDNN takes no strided operands
        return F.linear(x, weight, bias)
    return (compiled_onednn_linear if compiling else onednn_linear)(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same weights, names and initialisation) with ``qkv.linear.linear``'s fast paths."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        return linear(x, self.weight, self.bias)
