"""The mixture-of-experts feed-forward's two dispatches beside Hugging Face's Mixtral block, on a CPU.

    python -m benchmarks.moe [--quick] [--markdown docs]

One ``qkv.nn.moe.MixtureOfExperts`` layer (softmax router, top-k renormalised, SwiGLU experts), fp32, at a few
(tokens N, width C, expert width I, experts E, k) shapes: ``reference_dispatch`` (a loop over experts, each
finding its tokens with torch.where over the (N, k) choices), ``grouped_dispatch`` (the N·k assignments sorted
by expert once, one gather, one contiguous slice per expert, one index_add_) and transformers'
``MixtralSparseMoeBlock`` given the same weights (its default experts implementation). Forward at inference, and
forward + backward. Calls alternate round-robin; each time is the median of its rounds, so ratios come from
one run. The largest difference between the dispatches' outputs is printed beside.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts, grouped_dispatch, reference_dispatch

from .common import machine_info, table, time_interleaved, write_generated

SHAPES = [(512, 512, 1024, 8, 2), (2048, 512, 1024, 8, 2), (512, 256, 256, 64, 8)]  # N, C, I, E, k
QUICK = [(256, 256, 512, 8, 2), (256, 128, 128, 32, 4)]


def layer(C: int, I: int, E: int, k: int) -> MixtureOfExperts:
    return MixtureOfExperts(Router(C, E, k), SwiGLUExperts(E, C, I))


def hf_block(m: MixtureOfExperts):
    """transformers' MixtralSparseMoeBlock holding ``m``'s weights; None without transformers."""
    try:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    except ImportError:
        return None
    e = m.experts
    E, I, C = e.gate_proj.shape
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=C, intermediate_size=I, num_local_experts=E,
                                                num_experts_per_tok=m.router.top_k))
    with torch.no_grad():
        block.gate.weight.copy_(m.router.weight)
        block.experts.gate_up_proj.copy_(torch.cat([e.gate_proj, e.up_proj], dim=1))
        block.experts.down_proj.copy_(e.down_proj)
    return block


def measure_shape(shape: tuple, repeats: int) -> list[list]:
    N, C, I, E, k = shape
    torch.manual_seed(0)
    m, x = layer(C, I, E, k), torch.randn(1, N, C)
    hf = hf_block(m)
    paths = {"reference": lambda x: m.run(x, reference_dispatch), "grouped": lambda x: m.run(x, grouped_dispatch)}
    if hf is not None:
        paths["transformers Mixtral block"] = hf
    with torch.inference_mode():
        forward = time_interleaved({p: (lambda f=f: f(x)) for p, f in paths.items()}, repeats=repeats)
        diff = (paths["grouped"](x) - paths["reference"](x)).abs().max().item()
    xg = x.clone().requires_grad_()
    backward = time_interleaved({p: (lambda f=f: f(xg).square().sum().backward()) for p, f in paths.items()},
                                repeats=repeats)
    return [[f"N={N} C={C} I={I} E={E} k={k}", p, f"{forward[p] * 1e3:.2f}",
             f"{forward['reference'] / forward[p]:.2f}", f"{backward[p] * 1e3:.2f}",
             f"{backward['reference'] / backward[p]:.2f}", f"{diff:.1e}" if p == "grouped" else ""] for p in paths]


HEADER = {"en": ["shape", "path", "forward ms", "reference ÷ this", "forward+backward ms", "reference ÷ this",
                 "max abs(grouped − reference)"],
          "zh": ["形状", "路径", "前向 ms", "参考 ÷ 本项", "前向+反向 ms", "参考 ÷ 本项", "最大 abs(分组 − 参考)"]}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer rounds")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/moe.md, .zh.md, .json")
    args = p.parse_args(argv)
    from qkv.runtime import machine, source_commit

    print(machine_info())
    rows = []
    for shape in QUICK if args.quick else SHAPES:
        rows += measure_shape(shape, repeats=5 if args.quick else 15)
        print(f"{shape} done", file=sys.stderr, flush=True)
    saved = {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}",
             "command": "python -m benchmarks.moe " + " ".join(argv if argv is not None else sys.argv[1:]),
             "rows": rows}
    if args.markdown:
        note = {"en": "fp32, one layer; medians of alternating rounds; reference ÷ this > 1: faster than the loop.",
                "zh": "fp32，单层；交替轮次的中位数；参考 ÷ 本项 > 1：比逐专家循环快。"}
        write_generated(Path(args.markdown), "moe", saved,
                        lambda lang: table(saved["rows"], HEADER[lang]) + "\n\n" + note[lang])
    out = table(rows, HEADER["en"])
    print(out)
    print(json.dumps({"stamp": saved["stamp"]}))
    return out


if __name__ == "__main__":
    main()
