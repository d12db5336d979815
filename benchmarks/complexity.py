"""Time and peak memory against sequence length n, with the fitted exponent (FAQ Q4: O(n²) and its answers).

    python -m benchmarks.complexity [--quick]

Four ways to attend, causal, fp32, B=1, d_model 512 = 8 heads × 64: the reference path
(softmax(QKᵀ/√d)V holding the (n, n) weights), the fused path (F.scaled_dot_product_attention),
qkv.flash_attention (the tiled online softmax in plain PyTorch) and qkv.linear_attention
(Katharopoulos et al. 2020: another attention, not the same answer). The exponent is the
least-squares slope of log y against log n: about 2 for quadratic cost, about 1 for linear.
Time: medians of interleaved calls. Memory: the peak in a fresh process (benchmarks.memory).
"""
from __future__ import annotations

import argparse
import math

import torch

import qkv

from .common import machine_info, table, time_interleaved
from .memory import CALLS, D, H, LIMIT_GB, measure

LENGTHS = [256, 512, 1024, 2048, 4096, 8192]
QUICK_LENGTHS = [256, 512, 1024]
PATHS = ["reference", "fused", "flash", "linear"]


def attend(path: str):
    """The call that benchmarks.memory measures for ``path``, as a function of q, k, v."""
    return eval(f"lambda q, k, v: {CALLS[path]}", {"qkv": qkv})  # one table of calls for both measurements


def fits_memory(n: int, path: str) -> bool:
    """The reference path is skipped where one (H, n, n) fp32 score tensor passes half of LIMIT_GB (as in memory.py)."""
    return path != "reference" or H * n * n * 4 / 2**30 <= LIMIT_GB / 2


def fit_exponent(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log y against log n (y ≈ c · n^slope); NaN with fewer than two positive points."""
    points = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y is not None and y > 0]
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def run(lengths: list[int] = LENGTHS, *, repeats: int = 3, paths: list[str] = PATHS) -> list[dict]:
    """One row per (n, path): {"n", "path", "seconds", "peak_mb"}; None where the path was skipped."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for n in lengths:
        q, k, v = (torch.randn(1, H, n, D, device=device) for _ in range(3))  # (B, H, n, D)
        live = [p for p in paths if fits_memory(n, p)]
        with torch.inference_mode():
            calls = {p: (lambda fn=attend(p): fn(q, k, v)) for p in live}
            seconds = time_interleaved(calls, repeats=repeats, warmup=1)
        for p in paths:
            rows.append({"n": n, "path": p, "seconds": seconds.get(p),
                         "peak_mb": measure(n, p) if p in live else None})
    return rows


def exponents(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per path: {"time": slope of log seconds / log n, "memory": slope of log peak MB / log n}."""
    out = {}
    for p in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == p]
        ns = [r["n"] for r in mine]
        out[p] = {"time": fit_exponent(ns, [r["seconds"] for r in mine]),
                  "memory": fit_exponent(ns, [r["peak_mb"] for r in mine])}
    return out


def report(rows: list[dict]) -> str:
    """Two markdown tables: time and memory per n and path, then the fitted exponents."""
    fmt = lambda x, scale: "skipped" if x is None else f"{x * scale:.1f}"  # noqa: E731
    by_n = {}
    for r in rows:
        by_n.setdefault(r["n"], {})[r["path"]] = r
    paths = list(dict.fromkeys(r["path"] for r in rows))
    body = [[n] + [fmt(cell[p]["seconds"], 1e3) for p in paths] + [fmt(cell[p]["peak_mb"], 1) for p in paths]
            for n, cell in by_n.items()]
    header = ["n"] + [f"{p} ms" for p in paths] + [f"{p} MB" for p in paths]
    slopes = exponents(rows)
    fits = [[p, f"{slopes[p]['time']:.2f}", f"{slopes[p]['memory']:.2f}"] for p in paths]
    return table(body, header) + "\n\n" + table(fits, ["path", "time exponent", "memory exponent"])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"n in {QUICK_LENGTHS}")
    args = p.parse_args(argv)
    print(machine_info())
    out = report(run(QUICK_LENGTHS, repeats=2) if args.quick else run(LENGTHS))
    print(out)
    print(f"causal, fp32, B=1, H={H}, D={D}; reference skipped where one n×n score tensor exceeds "
          f"{LIMIT_GB / 2:.0f} GB; exponent = slope of log y / log n (2 quadratic, 1 linear)")
    return out


if __name__ == "__main__":
    main()
