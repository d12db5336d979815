"""Multi-head attention: qkv vs torch.nn.MultiheadAttention vs a spec-style naive module.

    python -m benchmarks.attention [--quick] [--breakdown]

Same weights, same input, calls interleaved, medians; forward and forward+backward; achieved
GFLOP/s as a fraction of this machine's fp32 matmul peak measured in the same run. qkv's module runs as
inference runs it, with the speed layer on top (``qkv.kernels.accelerate``: its linears' products at
inference through oneDNN on a CPU; the backward is ``F.linear``'s either way).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import qkv
import qkv.nn.flash
from qkv.interop.torch_nn import mha_to_torch
from qkv.kernels import accelerate

from .common import machine_info, matmul_peak_gflops, table, time_interleaved

SHAPES = [(8, 256, 512, 8), (4, 1024, 512, 8), (1, 4096, 512, 8)]
QUICK_SHAPES = [(8, 256, 512, 8), (4, 1024, 512, 8)]


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


def attention_flops(B: int, n: int, d: int) -> float:
    """Forward FLOPs: four d×d projections (2·B·n·d² each) + QKᵀ and weights·V (2·B·n²·d each)."""
    return 4 * 2 * B * n * d * d + 2 * 2 * B * n * n * d


def modules(d: int, h: int, device):
    ours = accelerate(qkv.MultiHeadAttention(d, h).to(device))
    theirs = mha_to_torch(ours)
    naive = NaiveMHA(d, h).to(device)
    with torch.no_grad():
        for lin, src in zip((naive.W_Q, naive.W_K, naive.W_V, naive.W_O),
                            (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj)):
            lin.weight.copy_(src.weight)
    calls = {"qkv": lambda x: ours(x), "nn.MHA": lambda x: theirs(x, x, x, need_weights=False)[0],
             "naive": lambda x: naive(x)}
    return calls


def run(B: int, n: int, d: int, h: int, repeats: int, peak: float) -> list[list]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    calls = modules(d, h, device)
    x = torch.randn(B, n, d, device=device)
    with torch.no_grad():
        ref = calls["qkv"](x)
        for name, fn in calls.items():
            torch.testing.assert_close(fn(x), ref, atol=1e-4, rtol=1e-4)
    with torch.inference_mode():
        fwd = time_interleaved({k: (lambda fn=fn: fn(x)) for k, fn in calls.items()}, repeats=repeats)
    xg = x.clone().requires_grad_(True)
    bwd = time_interleaved({k: (lambda fn=fn: fn(xg).sum().backward()) for k, fn in calls.items()},
                           repeats=max(3, repeats // 2))
    rows = []
    for label, t, flops in (("forward", fwd, attention_flops(B, n, d)), ("fwd+bwd", bwd, 3 * attention_flops(B, n, d))):
        gflops = flops / t["qkv"] / 1e9
        rows.append([f"({B}, {n}, {d}, {h})", label, f"{t['qkv'] * 1e3:.1f}", f"{t['nn.MHA'] * 1e3:.1f}",
                     f"{t['naive'] * 1e3:.1f}", f"{t['nn.MHA'] / t['qkv']:.2f}x", f"{t['naive'] / t['qkv']:.2f}x",
                     f"{gflops:.0f}", f"{gflops / peak:.2f}"])
    return rows


def breakdown(B: int, n: int, d: int, h: int, repeats: int, peak: float) -> list[list]:
    """Where qkv's forward goes (non-causal, fp32): its four projections, PyTorch's fused attention kernel,
    and inside that kernel's work, QKᵀ as one batched matmul (inner dimension d/h, scores written to memory)
    and the exponentials of the n²·h scores, computed tile by tile in cache as the kernel does;
    beside it a hand-tiled attention (``qkv.flash``, tiles of 256) and the math path (scores materialised)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mha, x = qkv.MultiHeadAttention(d, h).to(device), torch.randn(B, n, d, device=device)
    heads = lambda t: t.view(B, n, h, d // h).transpose(1, 2).contiguous()  # noqa: E731
    with torch.inference_mode():
        q, k, v = (heads(p(x)) for p in (mha.q_proj, mha.k_proj, mha.v_proj))  # (B, h, n, d/h)
        tile = torch.randn(256, 256, device=device)  # 256 KB: stays in cache, as the kernel's tiles do
        tiles = B * h * n * n // tile.numel()  # exp of every score once, one tile at a time
        torch.testing.assert_close(qkv.nn.flash.flash_attention(q, k, v, block_size=256),
                                   F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)
        parts = {
            "projections (4 Linear)": (lambda: [p(x) for p in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj)],
                                       8 * B * n * d * d),
            "fused attention kernel": (lambda: F.scaled_dot_product_attention(q, k, v), 4 * B * n * n * d),
            "  QKᵀ alone (bmm)": (lambda: torch.matmul(q, k.transpose(-2, -1)), 2 * B * n * n * d),
            "  exp of the n² scores, in cache": (lambda: [torch.exp(tile) for _ in range(tiles)], None),
            "hand-tiled (qkv.flash, 256)": (lambda: qkv.nn.flash.flash_attention(q, k, v, block_size=256),
                                            4 * B * n * n * d),
            "math path (softmax(QKᵀ)V)": (lambda: torch.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5, -1) @ v,
                                          4 * B * n * n * d),
        }
        t = time_interleaved({name: fn for name, (fn, _) in parts.items()}, repeats=repeats)
    shape = f"({B}, {n}, {d}, {h})"
    return [[shape, name, f"{t[name] * 1e3:.1f}", f"{flops / t[name] / 1e9:.0f}" if flops else "-",
             f"{flops / t[name] / 1e9 / peak:.2f}" if flops else "-"] for name, (_, flops) in parts.items()]


HEADER = ["(B, n, d, h)", "pass", "qkv ms", "nn.MHA ms", "naive ms", "nn.MHA / qkv", "naive / qkv",
          "qkv GFLOP/s", "of matmul peak"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two shapes, fewer repeats")
    p.add_argument("--breakdown", action="store_true", help="also time the parts of the forward at n >= 1024 "
                   "(always on without --quick)")
    args = p.parse_args(argv)
    print(machine_info())
    peak = matmul_peak_gflops()
    print(f"fp32 matmul peak (best median of an n×n product by torch.mm or oneDNN, n in 1024, 2048, 3072): "
          f"{peak:.0f} GFLOP/s")
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        rows += run(*shape, repeats=3 if args.quick else 9, peak=peak)
    out = table(rows, HEADER)
    print(out)
    print("ratios > 1: qkv is faster; medians of interleaved calls, fp32")
    if args.breakdown or not args.quick:
        parts = [row for shape in (QUICK_SHAPES if args.quick else SHAPES)[1:]
                 for row in breakdown(*shape, repeats=3 if args.quick else 7, peak=peak)]
        out += "\n\n" + table(parts, ["(B, n, d, h)", "forward part", "ms", "GFLOP/s", "of matmul peak"])
        print(table(parts, ["(B, n, d, h)", "forward part", "ms", "GFLOP/s", "of matmul peak"]))
    return out


if __name__ == "__main__":
    main()
