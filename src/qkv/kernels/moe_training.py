"""Mixture-of-experts layers in training: each of an expert's three products over every expert at once (a
speed-layer swap).

    sort_assignments(experts, E, align)    the N·k assignments by expert, each expert's rows padded   (M,) rows
    h = act(x W_gateᵀ, x W_upᵀ)            one torch._grouped_mm per product over the experts' row segments
    y = h W_downᵀ                          (M, I) -> (M, C)
    combine(y, order, weights)             back to the tokens, summed over their k choices           (N, C)

The reference layer's grouped dispatch (qkv.nn.moe.grouped_dispatch) runs one product per expert and so records
E gradient ops per weight; ``torch._grouped_mm`` takes every expert's rows in one call, one gradient op per
weight (one host sync where bf16 pads the rows, none in fp32), under autocast in autocast's dtype as
``F.linear``'s products. In bf16 each expert's rows are padded to a multiple of ``SEGMENT_ROWS``: oneDNN builds a
kernel per matrix shape, and the experts' loads change every step. It is built and tested for a CPU, fp32 or
bf16 products, SwiGLU experts without biases and rows 16-byte aligned, run eagerly; on a GPU of compute
capability 9.0 or more it takes bf16 products (torch's CUTLASS kernel; rows unpadded, so no host sync).
Elsewhere, in eval, without autograd or inside torch.compile the layer keeps its own dispatch;
``refuses`` says why (the check ``qkv.generation.paths`` lists as "grouped_mm") and
``grouped_mm_fallback`` holds the last forward's reason.
Tests: tests/test_moe.py (outputs and every gradient equal the reference loop's).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn.moe import MixtureOfExperts, Routing, SwiGLUExperts, combine, sort_assignments

SEGMENT_ROWS = 32  # bf16: each expert's rows padded to a multiple of this (see segment_rows)


def product_dtype(x: Tensor) -> torch.dtype:
    """The dtype the experts' products run in: autocast's where it is on for x's device, else x's (as ``F.linear``'s
    would: autocast leaves float64 as it is)."""
    device = x.device.type
    cast = torch.is_autocast_enabled(device) and x.dtype != torch.float64
    return torch.get_autocast_dtype(device) if cast else x.dtype


def segment_rows(x: Tensor) -> int:
    """The multiple each expert's rows are padded to: ``SEGMENT_ROWS`` for bf16 products on a CPU (oneDNN builds a
    kernel per matrix shape), else 1."""
    return SEGMENT_ROWS if product_dtype(x) == torch.bfloat16 and x.device.type == "cpu" else 1


def refuses_experts(experts: SwiGLUExperts, x: Tensor) -> str | None:
    """Why ``torch._grouped_mm`` cannot run these experts' products on x (built and tested here for a CPU, fp32 or
    bf16 (autocast's included), no biases, rows 16-byte aligned), or None."""
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no _grouped_mm"
    dtype, device = product_dtype(x), x.device
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if (reason := refuses_device(device.type, dtype, capability)) is not None:
        return reason
    if not torch.is_autocast_enabled(device.type) and x.dtype != experts.gate_proj.dtype:
        return f"tokens in {x.dtype}, weights in {experts.gate_proj.dtype}"
    if experts.gate_bias is not None:
        return "biased experts"
    I, C = experts.gate_proj.shape[1:]
    size = dtype.itemsize
    return None if (I * size) % 16 == 0 == (C * size) % 16 else "rows not 16-byte aligned"


def refuses_device(device: str, dtype: torch.dtype, capability: tuple[int, int] | None) -> str | None:
    """Why ``torch._grouped_mm`` has no kernel for ``dtype`` products on ``device`` (cpu | cuda of compute
    ``capability``), or None: a CPU's takes fp32 and bf16; CUDA's (CUTLASS, Hopper and later) bf16."""
    if device == "cpu":
        return None if dtype in (torch.float32, torch.bfloat16) else f"a cpu {dtype} product, not a CPU fp32 or bf16 one"
    if device != "cuda":
        return f"a {device} {dtype} product, not a CPU or CUDA one"
    if dtype != torch.bfloat16:
        return f"a cuda {dtype} product: _grouped_mm's CUDA kernel takes bf16"
    if capability < (9, 0):
        return f"compute capability {capability[0]}.{capability[1]}: _grouped_mm's CUDA kernel needs 9.0 or more"
    return None


def grouped_mm_experts(experts: SwiGLUExperts, x: Tensor, rows: Tensor) -> Tensor:
    """``SwiGLUExperts.segments`` with each product one ``torch._grouped_mm``: x (M, C) sorted by expert, rows (E,)
    each expert's -> (M, C). Where autocast asks, x and each stacked weight are cast once (F.linear's would cast
    x for the gate and again for the up product, and each expert's weights apart)."""
    offs, dtype = rows.cumsum(0).to(torch.int32), product_dtype(x)  # (E,) each expert's end row

    def product(v: Tensor, w: Tensor) -> Tensor:  # (M, K) @ (E, K, O) by segment -> (M, O)
        return torch._grouped_mm(v, w.to(dtype).transpose(1, 2), offs=offs)
    x = x.to(dtype)
    h = experts.activate(product(x, experts.gate_proj), product(x, experts.up_proj))  # (M, I)
    return product(h, experts.down_proj)  # (M, C)


def grouped_mm_dispatch(x: Tensor, routing: Routing, experts: SwiGLUExperts) -> Tensor:
    """``grouped_dispatch``'s sum with the experts' products grouped (``grouped_mm_experts``). x (N, C) -> (N, C)."""
    order = sort_assignments(routing.experts, experts.num_experts, segment_rows(x))
    y = grouped_mm_experts(experts, x.index_select(0, order.token), order.rows)  # (M, C) sorted by expert
    return combine(y, order, routing.weights.to(x.dtype))


def refuses(layer: MixtureOfExperts, x: Tensor, *, compiling: bool | None = None) -> str | None:
    """Why a forward of ``layer`` on x (B, T, C) keeps the layer's own dispatch rather than ``grouped_mm_dispatch``,
    or None (``qkv.generation.paths`` names this check "grouped_mm"). ``compiling``: whether it runs inside
    torch.compile (None: whether it does now)."""
    if layer.dispatch != "grouped":
        return f"the layer asks for the {layer.dispatch} dispatch"
    if not torch.is_grad_enabled():
        return "autograd is not recording (the layer's own grouped dispatch serves inference)"
    if torch.compiler.is_compiling() if compiling is None else compiling:
        return "inside torch.compile (whose fake _grouped_mm on a CPU takes bf16 only)"
    return layer.refuses_fast_dispatch() or refuses_experts(layer.experts, x)


class TrainingMixtureOfExperts(MixtureOfExperts):
    """A ``MixtureOfExperts`` whose grouped dispatch, where autograd records, runs its products through
    ``grouped_mm_dispatch`` (swapped in by ``qkv.kernels.accelerate_training``; the class alone changes).
    ``grouped_mm_fallback``: why the last forward kept the layer's own dispatch (None: it did not, or none ran)."""

    grouped_mm_fallback: str | None = None

    def forward(self, x: Tensor, *, return_router_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, T, C) -> (B, T, C) [, router logits (B·T, E)], as ``MixtureOfExperts.forward``."""
        self.grouped_mm_fallback = refuses(self, x)
        if self.grouped_mm_fallback is not None:
            return super().forward(x, return_router_logits=return_router_logits)
        return self.run(x, grouped_mm_dispatch, return_router_logits)
