"""Mixture-of-experts layers at inference: the dispatch chosen for decoding (a speed-layer swap).

    a few tokens (≤ MAX_ROWS), on a CPU, fp32   ``kernel_dispatch``: qkv's C++ op (``torch.ops.qkv.moe_swiglu``,
                                                csrc/moe.cpp) runs every chosen expert in two passes of the
                                                threads, each expert's weights read once where they lie; eager
                                                and inside torch.compile (an opaque op: no graph break)
    otherwise inside torch.compile              gathered_dispatch: static shapes, so the compiled one-token step
                                                is one graph (no break, no recompile per routing)
    otherwise                                   the layer's own dispatch (grouped)

Why not the grouped path at batch 1: a chosen expert there costs a gather, three products, an activation and an add,
each a pass of the threads, so a token passes them dozens of times a layer; on a shared host each pass may wait for a
descheduled thread. The kernel is the grouped dispatch (the same sums, experts in the same order) in two passes.
The grouped path's per-expert slices have data-dependent sizes, which torch.compile cannot trace without a graph
break, so inside it the gathered path runs where the kernel does not.

Every dispatch gives one answer (tests/test_moe.py, tests/test_moe_decode.py); a layer whose experts the fast
dispatches were not built for (not ``SwiGLUExperts``, or hooked), that asked for "reference", or in training keeps
its own forward, which says why where it falls back. ``refuses`` says why the kernel does not run (the check
``qkv.generation.paths`` lists as "moe_kernel").
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn.moe import MixtureOfExperts, Routing, SwiGLUExperts, gathered_dispatch
from . import build
from .linear import plain_tensor


def gathers() -> bool:
    """Whether the gathered dispatch runs where the kernel does not (see the module's rule): inside torch.compile."""
    return torch.compiler.is_compiling()


def refuses(experts: SwiGLUExperts, x: Tensor) -> str | None:
    """Why ``kernel_dispatch`` cannot run ``experts`` on x (N, C), or None: it was built and tested for a few fp32
    tokens on a CPU at inference, through plain SwiGLU experts without biases, where qkv's kernels are built."""
    if not x.is_cpu or x.dtype != torch.float32:
        return f"it runs fp32 tokens on a CPU, got {x.dtype} on {x.device}"
    on = "grad mode" if torch.is_grad_enabled() else "CPU autocast" if torch.is_autocast_enabled("cpu") else None
    if on is not None:
        return f"it runs inference without autograd or autocast, got {on} on"
    if x.size(0) > build.MAX_ROWS:
        return f"it runs at most {build.MAX_ROWS} tokens, got {x.size(0)}"
    if experts.activation != "swiglu":
        return f"it runs swiglu experts, got {experts.activation}"
    weights = (experts.gate_proj, experts.up_proj, experts.down_proj)
    if any(b is not None for b in (experts.gate_bias, experts.up_bias, experts.down_bias)):
        return "it runs experts without biases"
    if not all(plain_tensor(w) and w.dtype == torch.float32 and w.is_contiguous() for w in weights):
        return "it reads contiguous plain fp32 expert weights"
    if not (build.LOADED if torch.compiler.is_compiling() else build.available()):
        return f"qkv's C++ kernels are not built: {build.WHY_NOT}"
    return None


def kernel_dispatch(x: Tensor, routing: Routing, experts: SwiGLUExperts) -> Tensor:
    """``grouped_dispatch``'s sum through ``torch.ops.qkv.moe_swiglu``. x (N, C) -> (N, C)."""
    return torch.ops.qkv.moe_swiglu(x.contiguous(), routing.experts.contiguous(),
                                    routing.weights.float().contiguous(), experts.gate_proj, experts.up_proj,
                                    experts.down_proj)


class DecodeMixtureOfExperts(MixtureOfExperts):
    """A ``MixtureOfExperts`` whose forward at inference runs the kernel or the gathered dispatch (see the module's
    rule; the class alone is swapped in by ``qkv.kernels.accelerate``: parameters, names and state dict are the
    layer's own)."""

    def forward(self, x: Tensor, *, return_router_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, T, C) -> (B, T, C) [, router logits (B·T, E)], as ``MixtureOfExperts.forward``."""
        logits = return_router_logits
        if self.training or self.dispatch == "reference" or self.refuses_fast_dispatch() is not None:
            return super().forward(x, return_router_logits=logits)
        if refuses(self.experts, x.reshape(-1, x.size(-1))) is None:
            return self.run(x, kernel_dispatch, logits)
        return self.run(x, gathered_dispatch, logits) if gathers() else super().forward(x, return_router_logits=logits)
