"""qkv's matrix-vector kernel, ``torch.ops.qkv.matvec(x, weight, bias)``: ``F.linear`` for a few rows
of x (batch-1 decoding, a small beam), in one pass over the weight at the rate the memory allows.

    x (..., K) with at most MAX_ROWS rows, W (N, K), b (N,) or None  ->  (..., N), fp32 or bf16, CPU

Neither of PyTorch's CPU products streams a weight that fast: MKL's ``F.linear`` runs one row on one
core, and oneDNN's costs ~12 µs a call and, on 2 Zen 5 cores, read 1.5–3 MB weights at 0.55–0.75 of a
plain read; this kernel streamed a 92.4 MB matrix at 0.96–1.15 of a plain ``sum`` over this round's runs of
``python -m benchmarks --only generation`` (its dot products, ``dot.h``, keep four AVX-512 sums a row and
reduce sixteen rows' sums together).

The kernel (``matvec.cpp``, 89 lines, with ``dot.h``) is built at first use with ``torch.utils.cpp_extension`` for
this CPU (``-march=native``), in one extension with the fused decode step (``decoder_step.cpp``,
``qkv.decoder_step``): 13–20 s once, then loaded from ``cache_dir()/kernels``. Where they cannot be
built (no C++ compiler, no ``ninja``), a warning says why; then, and with ``QKV_MATVEC=0``,
``available()`` is False, ``qkv.linear`` uses oneDNN and ``F.linear`` and ``generate(compile=True)`` inductor.
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..runtime import cache_dir

SOURCES = tuple(Path(__file__).parent / "csrc" / f for f in ("matvec.cpp", "decoder_step.cpp"))  # one build: qkv's kernels
HEADERS = (Path(__file__).parent / "csrc" / "dot.h",)  # included by both: part of the build's name
# -fno-trapping-math: without it GCC leaves the activations' and softmax's exp_vec loops scalar ("control flow in
# loop": the clamps); it changes no result, only lets a comparison become a select. Part of the build's name too.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-trapping-math")
MAX_ROWS = 4  # measured: from 8 rows on, oneDNN's blocked product is as fast or faster
DTYPES = (torch.float32, torch.bfloat16)  # bf16: half the bytes, summed in fp32 (as oneDNN's bf16 product)
LOADED: bool | None = None  # None: not tried yet; read by qkv.linear (also while compiling, as a constant)
WHY_NOT = ""  # why the kernels are not available, once load() has said no
MODULE = None  # the built extension, as a Python module (qkv.decoder_step's DecoderState is in it)
REGISTERED = False
LOADING = threading.Lock()


def available() -> bool:
    """Whether ``torch.ops.qkv.matvec`` (and ``qkv.decoder_step``'s ``MODULE.DecoderState``) can be called: builds
    or loads them on the first call."""
    global LOADED
    if LOADED is None:
        with LOADING:  # one thread builds and registers; the others wait for its answer
            if LOADED is None:
                LOADED = load()
    return LOADED


def load() -> bool:
    """Build (once per sources, torch and Python version and CPU) and load the kernels; False, with a warning, if they
    cannot."""
    global WHY_NOT
    if os.environ.get("QKV_MATVEC", "1") == "0":
        WHY_NOT = "QKV_MATVEC=0 turns them off"
        return False
    try:
        from torch.utils import cpp_extension

        name, folder = build_name(), build_folder()
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / f"{name}.so").exists():
            print(f"qkv: building its C++ kernels for this CPU (once, 10-30 s) in {folder}",
                  file=sys.stderr, flush=True)
        module = cpp_extension.load(name, [str(f) for f in SOURCES], extra_cflags=list(FLAGS),
                                    extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=True)
    except Exception as e:  # a missing compiler or ninja, a failed build: the reference paths still work
        WHY_NOT = f"the build failed: {type(e).__name__}: {str(e)[:200]}"
        warnings.warn(f"qkv: could not build its C++ kernels ({type(e).__name__}: {str(e)[:300]}); decoding "
                      "uses oneDNN's product and inductor instead (about 1.3x slower at batch 1)",
                      RuntimeWarning, stacklevel=3)
        return False
    global MODULE
    MODULE = module
    register()
    return True


def why_not() -> str:
    """Why ``available()`` said no ("" when it said yes, or has not been asked)."""
    return WHY_NOT


def build_name() -> str:
    """The extension's name: one per source texts and flags, torch version (its ABI changes between releases)
    and CPU (``-march=native`` code may not run on another, should a cache folder be shared)."""
    key = b"".join(f.read_bytes() for f in SOURCES + HEADERS) + " ".join(FLAGS).encode()
    key += torch.__version__.encode() + cpu_signature().encode()
    return f"qkv_matvec_{hashlib.sha256(key).hexdigest()[:12]}"


def cpu_signature() -> str:
    """The CPU's model and instruction-set flags (Linux), else the platform's name for it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    found = [line for line in lines if line.startswith(("model name", "flags", "Features"))][:2]
    return "\n".join(found) or f"{platform.machine()} {platform.processor()}"


def build_folder() -> Path:
    """``cache_dir()/kernels/py3XX``, or torch's own extensions folder when qkv's cache is off."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    root = cache_dir()
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root
        return Path(get_default_build_root()) / tag
    return root / "kernels" / tag


def register() -> None:
    """What compile and the FLOP counter need to know of the op: its output's shape, its FLOPs."""
    from torch.utils import flop_counter

    global REGISTERED
    if not REGISTERED:  # once a process, though tests load again
        torch.library.register_fake("qkv::matvec")(linear_shape)
        flop_counter.register_flop_formula(torch.ops.qkv.matvec)(linear_flops)
        REGISTERED = True


def linear_shape(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The output's shape and dtype alone, for compile's fake tensors (this op's and qkv.linear's oneDNN op)."""
    return x.new_empty(*x.shape[:-1], weight.size(0))


def linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """2·M·N·K for ``torch.utils.flop_counter``, which knows F.linear's matmul but not oneDNN's or this op."""
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]
