"""Mixture-of-experts layers at inference: the dispatch chosen by the number of tokens (a speed-layer swap).

Shapes: N tokens in the call (B·T), k experts per token, E experts.

    N·k ≤ E, or inside torch.compile   gathered_dispatch: each assignment's expert weights gathered, batched
                                       products; static shapes (the compiled decode step traces it whole, no
                                       graph break, no recompile per routing) and only the chosen experts read
    otherwise                          the layer's own dispatch (grouped: each chosen expert read once)

Why N·k ≤ E: the gathered path reads N·k experts' weights, the grouped path at most E (each expert hit once,
with a host sync and a Python loop over the E experts on top). With N·k ≤ E the gathered path reads no more
weights than the grouped one could, and drops its loop: batch-1 decoding (N = 1) always qualifies. Inside
torch.compile the grouped path's data-dependent slice sizes would break the graph, so the gathered path runs
whatever N (the same answer, more weights read for large batches).

The three dispatches give one answer (tests/test_moe.py, 1e-6 in fp32); a layer whose experts the fast
dispatches were not built for (not ``SwiGLUExperts``, or hooked) or that asked for "reference" keeps its own
forward, which says why where it falls back.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn.moe import MixtureOfExperts, gathered_dispatch


def gathers(tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether ``tokens`` tokens take the gathered dispatch (see the module's rule)."""
    return tokens * top_k <= num_experts or torch.compiler.is_compiling()


class DecodeMixtureOfExperts(MixtureOfExperts):
    """A ``MixtureOfExperts`` whose forward at inference picks the gathered dispatch for few tokens (the class
    alone is swapped in by ``qkv.kernels.accelerate``: parameters, names and state dict are the layer's own)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        tokens = x.numel() // x.size(-1)
        if (self.training or self.dispatch == "reference" or self.grouped_refusal() is not None
                or not gathers(tokens, self.router.top_k, self.router.num_experts)):
            return super().forward(x)
        return self.run(x, gathered_dispatch)
