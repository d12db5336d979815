"""``nn.Linear`` whose one-row product at inference uses every core: what decoding one token is.

    y = x Wᵀ + b      x (..., K) with one row, W (N, K), b (N,)

At batch 1 each decoded token is one matrix-vector product per weight, so its speed is the
rate at which the weights stream from memory. MKL computes such a product on one core
(measured on 2 cores: 23 GB/s, where a plain read of the same 128 MB streams 63), so:

- eager: the rows of W are split into one block per thread, a ``bmm`` over views of W (no copy)
  that ATen runs in parallel (``threaded_matvec``);
- under ``torch.compile``: the product is written as the reduction it is, ``(W * x).sum(-1)``,
  which inductor fuses into one vectorised pass over W on every core (``reduction_matvec``).

``F.linear`` is the reference: every other input (several rows, autograd, another device)
goes through it (and autocast, which casts the weights inside it), and the tests check the fast
paths against it.
Shapes: K input width, N output width, P parts (threads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def threaded_matvec(x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> Tensor:
    """x (..., K) holding one row -> (..., N): W's rows in ``parts`` blocks, one product per thread."""
    N, K = weight.shape
    n = N - N % parts  # rows that split evenly; a remainder (GPT-2's 50257-token head) goes alone
    if parts < 2 or n == 0 or not weight.is_contiguous():
        return F.linear(x, weight, bias)
    xs = x.reshape(1, 1, K).expand(parts, 1, K)  # (P, 1, K), no copy
    ws = weight[:n].view(parts, n // parts, K).transpose(1, 2)  # (P, K, n/P), views of W
    if bias is None:
        y = torch.bmm(xs, ws)  # (P, 1, n/P)
    else:
        y = torch.baddbmm(bias[:n].view(parts, 1, n // parts), xs, ws)
    y = y.view(1, n)  # the blocks in order: (P, 1, n/P) is (1, n) in memory
    if n < N:
        y = torch.cat([y, F.linear(x.reshape(1, K), weight[n:], None if bias is None else bias[n:])], dim=-1)
    return y.view(*x.shape[:-1], N)


def reduction_matvec(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) holding one row -> (..., N) as Σ_k W[n, k] x[k]: for inductor to fuse, never eager
    (eagerly it would materialise the whole (N, K) product)."""
    y = (weight * x.reshape(1, -1)).sum(-1)  # (N,)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.size(0))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on a CPU at inference, one row goes through a matrix-vector fast path."""
    one_row = x.numel() == weight.size(1) and x.device.type == "cpu"
    if not one_row or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):  # autocast casts in F.linear
        return F.linear(x, weight, bias)
    if torch.compiler.is_compiling():
        return reduction_matvec(x, weight, bias)
    if weight.dtype != torch.float32:  # bf16 goes to oneDNN, whose product is threaded already
        return F.linear(x, weight, bias)
    return threaded_matvec(x, weight, bias, torch.get_num_threads())


class Linear(nn.Linear):
    """``nn.Linear`` (same weights, names and initialisation) with ``qkv.linear.linear``'s fast path."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        return linear(x, self.weight, self.bias)
