"""Multi-head attention forward: qkv vs torch.nn.MultiheadAttention vs a spec-style naive module.

    python -m benchmarks.attention [--quick]

Same weights, same input, calls interleaved, medians; ratios are what to read.
"""
from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import qkv
from qkv.interop.torch_nn import mha_to_torch

from .common import machine_info, table, time_interleaved


class NaiveMHA(nn.Module):
    """The spec's chapter-2 module with its axis bug fixed: four Linear, split heads, softmax(QKᵀ/√d_k)V."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x):
        B, n, d = x.shape
        split = lambda t: t.view(B, n, self.h, self.d_k).transpose(1, 2)  # (B, n, d) -> (B, h, n, d_k)  # noqa: E731
        Q, K, V = split(self.W_Q(x)), split(self.W_K(x)), split(self.W_V(x))
        attn = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)  # (B, h, n, n)
        return self.W_O((attn @ V).transpose(1, 2).reshape(B, n, d))  # (B, h, n, d_k) -> (B, n, d)


def run(B: int, n: int, d: int, h: int, repeats: int, causal: bool = False) -> list:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ours = qkv.MultiHeadAttention(d, h).to(device).eval()
    theirs = mha_to_torch(ours).eval()
    naive = NaiveMHA(d, h).to(device).eval()
    with torch.no_grad():
        for lin, src in zip((naive.W_Q, naive.W_K, naive.W_V, naive.W_O),
                            (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj)):
            lin.weight.copy_(src.weight)
    x = torch.randn(B, n, d, device=device)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours(x), naive(x), atol=1e-4, rtol=1e-4)
        t = time_interleaved({
            "qkv": lambda: ours(x),
            "torch": lambda: theirs(x, x, x, need_weights=False),
            "naive": lambda: naive(x),
        }, repeats=repeats)
    return [f"({B}, {n}, {d}, {h})", f"{t['qkv'] * 1e3:.1f}", f"{t['torch'] * 1e3:.1f}", f"{t['naive'] * 1e3:.1f}",
            f"{t['torch'] / t['qkv']:.2f}x", f"{t['naive'] / t['qkv']:.2f}x"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    args = p.parse_args(argv)
    print(machine_info())
    rows = [run(4, 1024, 512, 8, repeats=5 if args.quick else 15)]
    print(table(rows, ["(B, n, d, h)", "qkv ms", "nn.MHA ms", "naive ms", "nn.MHA / qkv", "naive / qkv"]))
    print("ratios > 1 mean qkv is faster; medians of interleaved calls, fp32, forward only")


if __name__ == "__main__":
    main()
