"""Every side-by-side measurement in one run: ``python -m benchmarks [--quick] [--only NAME ...]``.

attention  (a) MHA forward and forward+backward vs nn.MultiheadAttention and a naive module
memory     (b) peak memory of one attention forward, fused vs reference path
generation (c) greedy tokens/s, eager and compiled, vs Hugging Face generate and the memory roofline
train_speed (d) training tokens/s and MFU vs Hugging Face GPT2LMHeadModel
marian     (e) beam-search translation (8 and 32 sentences, beam 4) vs Hugging Face MarianMTModel.generate
low_precision (f) bf16 weights for decoding beside fp32: tokens/s, and bits per character of runs/demo
complexity time and memory against n, fitted exponents: reference, fused, flash, linear attention
           (the README's table of claims)
"""
from __future__ import annotations

import argparse
import importlib
import time

SECTIONS = ["attention", "memory", "generation", "train_speed", "complexity", "marian", "low_precision"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats (a few minutes)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    args = p.parse_args(argv)
    for name in args.only or SECTIONS:
        print(f"\n## {name}\n", flush=True)
        t0 = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        module.main(["--quick"] if args.quick else [])
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
