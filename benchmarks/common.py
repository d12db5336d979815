"""Shared helpers for side-by-side measurements: interleaved repeats, medians, machine info."""
from __future__ import annotations

import os
import platform
import statistics
import time

import torch


def machine_info() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    return (f"torch {torch.__version__}, {dev}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
            f"python {platform.python_version()}")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_interleaved(fns: dict, *, repeats: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each fn, calls interleaved round-robin so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def table(rows: list[list], header: list[str]) -> str:
    cols = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cols[1:]])


def matmul_peak_gflops(sizes=(1024, 2048, 3072), repeats: int = 5) -> float:
    """This machine's fp32 matmul throughput: the best median GFLOP/s of n×n torch.mm over a few n."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        t = time_interleaved({"mm": lambda: torch.mm(a, b)}, repeats=repeats)["mm"]
        best = max(best, 2 * n**3 / t / 1e9)
    return best


def matvec_bandwidth(megabytes: int = 128, repeats: int = 15, dtype=torch.float32) -> float:
    """Memory bandwidth in GB/s: the best of ``repeats`` matrix-vector products over a ``megabytes`` matrix.

    At batch 1 a decoder's step is such products; the matrix is large so that it streams from
    memory (a smaller one partly stays in cache and looks faster). Best, not median, as STREAM
    reports: on a shared machine the other jobs only ever slow a run down.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cols = 4096
    rows = megabytes * 2**20 // (cols * torch.tensor([], dtype=dtype).element_size())
    w, x = torch.randn(rows, cols, device=device).to(dtype), torch.randn(cols, device=device).to(dtype)
    torch.mv(w, x)
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        torch.mv(w, x)
        sync()
        best = min(best, time.perf_counter() - t0)
    return w.numel() * w.element_size() / best / 1e9
