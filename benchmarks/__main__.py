"""Every side-by-side measurement in one run: ``python -m benchmarks [--quick] [--only NAME ...] [--nanogpt PATH]``.

attention  (a) MHA forward and forward+backward vs nn.MultiheadAttention and a naive module
memory     (b) peak memory of one attention forward, fused vs reference path
generation (c) greedy tokens/s, eager and compiled, vs Hugging Face generate and the memory roofline
train_speed (d) training tokens/s and MFU vs Hugging Face GPT2LMHeadModel, and at the demo's shape vs nanoGPT's
           model.py (--nanogpt PATH), eager and compiled (the compile counted)
marian     (e) beam-search translation (8 and 32 sentences, beam 4) vs Hugging Face MarianMTModel.generate
low_precision (f) bf16 weights for decoding beside fp32: tokens/s, and bits per character of runs/demo
open_models batch-1 decoding of Qwen2- and Gemma-2-shaped models vs Hugging Face generate; the ring
           cache's memory against a full cache
sliding    (h) a Mistral-shaped model's batch-1 greedy tokens/s on eager, auto, inductor and fused (its page in
           docs/generated/sliding.md too)
complexity time and memory against n, fitted exponents: reference, fused, flash, linear attention
           (the README's table of claims)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
import time
from pathlib import Path

SECTIONS = ["attention", "memory", "generation", "train_speed", "complexity", "marian", "low_precision", "open_models",
            "sliding"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats (a few minutes)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    p.add_argument("--nanogpt", metavar="PATH", help="nanoGPT's model.py: train_speed also times nanoGPT (imported "
                   "from there at run time)")
    p.add_argument("--markdown", type=Path, metavar="DIR", help="also write DIR/speed.md and DIR/speed.zh.md from "
                   "this run (date, commit, machine, command) and the READMEs' speed table (benchmarks.report)")
    args = p.parse_args(argv)
    from qkv.runtime import machine

    where, outputs = machine(), {}  # before any section sets its own thread count
    for name in args.only or SECTIONS:
        print(f"\n## {name}\n", flush=True)
        t0 = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        with tee() as seen:
            module.main(section_args(name, args))
        outputs[name] = seen.getvalue()
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    if args.markdown:
        from . import report

        command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
        for path in report.write(args.markdown, outputs, command.strip(), where):
            print(f"wrote {path}")
    return 0


def section_args(name: str, args: argparse.Namespace) -> list[str]:
    """The command line a section's own ``main`` gets: --quick, --nanogpt for train_speed, and --markdown for
    sliding (its page in docs/generated too)."""
    extra = ["--nanogpt", args.nanogpt] if name == "train_speed" and args.nanogpt else []
    extra += ["--markdown", str(args.markdown)] if name == "sliding" and args.markdown else []
    return (["--quick"] if args.quick else []) + extra


class Tee(io.StringIO):
    """A copy of what is printed, still printed."""

    def __init__(self, out) -> None:
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def tee():
    """What a section prints, kept (for --markdown) and shown as it comes."""
    seen = Tee(sys.stdout)
    with contextlib.redirect_stdout(seen):
        yield seen


if __name__ == "__main__":
    raise SystemExit(main())
