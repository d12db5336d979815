"""``nn.Linear`` whose product at inference on a CPU streams its weight on every core.

    y = x Wᵀ + b      x (..., K), W (N, K), b (N,)

Decoding one token at batch 1 is one matrix-vector product per weight, so its speed is the rate
at which the weights stream from memory. ``F.linear`` (MKL in PyTorch's CPU builds) computes such
a product on one core, and more rows at half of oneDNN's speed (measured on 2 AMD Zen 5 cores: one
row over 128 MB, MKL 25 GB/s, oneDNN 55, a plain read 86; 2 to 1 024 rows, oneDNN 2.0-2.4x MKL), so:

- under ``torch.compile``, one row: the product written as the reduction it is, ``(W * x).sum(-1)``,
  which inductor fuses with its neighbours into one vectorised pass over W on every core
  (``reduction_matvec``; measured in the decode step: 7 % faster than calling the kernel below);
- up to ``matvec.MAX_ROWS`` rows (batch-1 decoding, a small beam), eager, and compiled from two rows:
  qkv's own kernel, ``torch.ops.qkv.matvec``, which reads each weight in one pass at the rate of a
  plain read (``qkv.matvec``; built at first use, and where it cannot be, the paths below serve);
- more rows: oneDNN's inner product, which PyTorch ships and inductor's CPU fusions call
  (``onednn_linear``), under compile kept opaque (``compiled_onednn_linear``).

``F.linear`` is the reference: autograd (training), autocast (which casts the weights inside it),
other dtypes (bf16 beyond the kernel's rows goes to oneDNN inside it), small weights (where oneDNN's call costs more than the
product), other devices and builds without oneDNN go through it; the tests check the fast paths
against it.
Shapes: K input width, N output width, M rows.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import flop_counter

from . import matvec
from .matvec import linear_flops, linear_shape

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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through the fast paths above at inference on a CPU."""
    if not x.is_cpu or not x.numel() or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)
    compiling = torch.compiler.is_compiling()
    dense = weight.dtype == x.dtype and weight.is_contiguous() and x.is_contiguous() and (
        bias is None or bias.dtype == x.dtype and bias.is_contiguous())
    if compiling and x.numel() == weight.size(1):  # fused with its neighbours: 7 % faster than an opaque op
        return reduction_matvec(x, weight, bias)
    if (dense and x.dtype in matvec.DTYPES and x.numel() <= matvec.MAX_ROWS * weight.size(1)
            and (matvec.LOADED if compiling else matvec.available())):
        return torch.ops.qkv.matvec(x, weight, bias)  # a few rows: qkv's own kernel, where it is built
    plain = dense and x.dtype == torch.float32
    if not plain or not ONEDNN or weight.numel() < ONEDNN_MIN_WEIGHT:  # oneDNN takes no strided operands
        return F.linear(x, weight, bias)
    return (compiled_onednn_linear if compiling else onednn_linear)(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same weights, names and initialisation) with ``qkv.linear.linear``'s fast paths."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        return linear(x, self.weight, self.bias)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        """As nn.Linear's, but a weight laid in a shared block (``lay_end_to_end``) is saved as its own copy:
        every reader of a state dict (safetensors refuses tensors sharing memory) sees plain tensors."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("weight", "bias") if not keep_vars else ():
            t = destination.get(prefix + name)
            if t is not None and t.untyped_storage().nbytes() != t.nbytes:
                destination[prefix + name] = t.clone()


# --- linears that read the same input, as one product -----------------------------------------------
# Decoding one token, each call of oneDNN's product costs ~10 µs beside its stream, and a 1 MB weight
# streams at 0.6 of a 4 MB one (measured: 512 × 512 at 27 GB/s, 1 536 × 512 at 35): q, k and v as one
# (3C, C) product saves ~28 µs a layer. Their weights stay three parameters with their own names,
# laid end to end in one block of memory, which the product reads as one matrix.

def plain(m: nn.Module) -> bool:
    """An nn.Linear or qkv Linear as it is: no subclass (a LoRA layer, a parametrisation) and no hooks."""
    return type(m) in (Linear, nn.Linear) and not (m._forward_hooks or m._forward_pre_hooks)


def lay_end_to_end(*linears: nn.Linear) -> None:
    """Move the weights (and biases) of plain ``linears`` sharing an input width, dtype and device into
    one block of memory each, in order. The parameters stay the same objects (``.data`` moves), values too."""
    if not all(plain(m) for m in linears):
        return
    for name in ("weight", "bias"):
        params = [getattr(m, name) for m in linears]
        if any(p is None for p in params) or len({(p.dtype, p.device, p.shape[1:]) for p in params}) > 1:
            continue
        if adjacent([p.detach() for p in params]) is not None:
            continue  # laid already: nothing to copy
        with torch.no_grad():
            block = torch.cat([p.detach() for p in params])  # (ΣN, K) or (ΣN,)
        for p, part in zip(params, block.split([p.size(0) for p in params])):
            p.data = part
    END_TO_END.pop(linears[0], None)  # the old block's views: let its memory go


def end_to_end(*linears: nn.Linear) -> tuple[Tensor, Tensor | None] | None:
    """The weights (ΣN, K) and biases (ΣN,) of plain ``linears`` laid end to end in memory, as views of
    it, for one product at inference; None when they are not (moved since, hooked, adapted, training)."""
    if torch.compiler.is_compiling() or not all(plain(m) for m in linears):
        return None  # data pointers are not traced; a subclass (LoRA) or a hook must see its own call
    weights, biases = [m.weight for m in linears], [m.bias for m in linears]
    if weights[0].is_meta or (torch.is_grad_enabled() and any(w.requires_grad for w in weights)):
        return None  # meta has no memory; a view across parameters would misroute gradients
    # Finding out costs ~10 µs a call (a token's three projections save ~30): remembered per layer. The same
    # pointers, shapes and dtypes mean the same memory: the remembered views keep theirs from being reused.
    key = tuple(None if t is None else (t.data_ptr(), t.shape, t.dtype) for t in weights + biases)
    seen = END_TO_END.get(linears[0])
    if seen is None or seen[0] != key:
        seen = key, laid_views(weights, biases)
        END_TO_END[linears[0]] = seen
    return seen[1]


END_TO_END: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # first linear -> (key, end_to_end's answer)


def laid_views(weights: list[Tensor], biases: list[Tensor | None]) -> tuple[Tensor, Tensor | None] | None:
    """``end_to_end``'s answer for these parameters, found from their memory."""
    weight = adjacent(weights)
    if weight is None or all(b is None for b in biases):
        return None if weight is None else (weight, None)
    bias = None if any(b is None for b in biases) else adjacent(biases)
    return None if bias is None else (weight, bias)


def adjacent(parts: list[Tensor]) -> Tensor | None:
    """``torch.cat(parts)`` as a view, when the contiguous ``parts`` lie end to end in one storage; else None."""
    first, end = parts[0], parts[0].data_ptr()
    storage = first.untyped_storage().data_ptr()
    for t in parts:
        if (t.data_ptr() != end or not t.is_contiguous() or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != storage):
            return None
        end += t.nbytes
    return first.as_strided((sum(t.size(0) for t in parts), *first.shape[1:]), first.stride())
