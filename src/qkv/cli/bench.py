"""`qkv bench`: the side-by-side measurements of a source checkout (`python -m benchmarks`)."""
from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path

from .errors import CommandError

CHECKOUT = Path(__file__).resolve().parents[3]  # src/qkv/cli/bench.py -> the checkout's root


def add_bench(sub) -> argparse.ArgumentParser:
    """Declare `qkv bench`."""
    p = sub.add_parser("bench", help="side-by-side speed and memory measurements (python -m benchmarks)",
                       description="Run benchmarks/ from a source checkout: attention vs nn.MultiheadAttention, "
                                   "memory of fused vs reference attention, generation and training vs Hugging Face, "
                                   "time and memory against n.")
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    p.add_argument("--only", nargs="+", metavar="SECTION",
                   help="attention | memory | generation | train_speed | complexity")
    return p


def run_bench(args: argparse.Namespace) -> int:
    """Check the sections, then run `python -m benchmarks` in the checkout; its exit status."""
    main_py = CHECKOUT / "benchmarks" / "__main__.py"
    if not main_py.is_file():
        raise CommandError("qkv bench runs the benchmarks/ folder of a source checkout; none found beside this install")
    sections = runpy.run_path(str(main_py), run_name="benchmarks_sections")["SECTIONS"]  # not "__main__": no run
    unknown = sorted(set(args.only or []) - set(sections))
    if unknown:
        raise CommandError(f"unknown benchmark section(s) {unknown}; choose from {sections}")
    flags = (["--quick"] if args.quick else []) + (["--only", *args.only] if args.only else [])
    return subprocess.run([sys.executable, "-m", "benchmarks", *flags], cwd=CHECKOUT).returncode
