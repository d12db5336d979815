"""Mixture-of-experts layers at inference: the dispatch chosen for the compiled decode step (a speed-layer swap).

    inside torch.compile   gathered_dispatch: each assignment's expert weights gathered, batched products; static
                           shapes, so the compiled one-token step is one graph (no break, no recompile per routing)
                           and the gather is compiled with the products that read it
    otherwise              the layer's own dispatch (grouped: each chosen expert read once, in place)

Why not gathered in eager mode too: there ``index_select`` copies the N·k chosen experts' weights before the batched
product reads them again, while the grouped path reads them where they lie (a one-layer check at batch 1 on a CPU
found the grouped path the faster). The grouped path's per-expert slices have
data-dependent sizes, which torch.compile cannot trace without a graph break, so inside it the gathered path runs
whatever the number of tokens (the same answer; for large batches it reads more weights).

The three dispatches give one answer (tests/test_moe.py, 1e-6 in fp32); a layer whose experts the fast
dispatches were not built for (not ``SwiGLUExperts``, or hooked), that asked for "reference", or in training keeps
its own forward, which says why where it falls back.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn.moe import MixtureOfExperts, gathered_dispatch


def gathers() -> bool:
    """Whether the gathered dispatch runs (see the module's rule): inside torch.compile."""
    return torch.compiler.is_compiling()


class DecodeMixtureOfExperts(MixtureOfExperts):
    """A ``MixtureOfExperts`` whose forward at inference under torch.compile runs the gathered dispatch (the class
    alone is swapped in by ``qkv.kernels.accelerate``: parameters, names and state dict are the layer's own)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        if self.training or self.dispatch == "reference" or self.grouped_refusal() is not None or not gathers():
            return super().forward(x)
        return self.run(x, gathered_dispatch)
