"""qkv's C++ kernels for the CPU: built once per machine where they can run and pay, loaded afterwards, and the
reason said where they are not.

    torch.ops.qkv.matvec(x, weight, bias)   F.linear for x (..., K) of at most MAX_ROWS rows, W (N, K), b (N,)
                                            or None -> (..., N), fp32 or bf16, in one pass over W (matvec.cpp)
    torch.ops.qkv.moe_swiglu(x, experts,    a few tokens through their chosen SwiGLU experts, each expert's
        weights, gate, up, down)            weights read once in place (moe.cpp, qkv.kernels.moe)
    torch.ops.qkv.paged_decode_attention(   one query per row and head over its blocks where they lie in a paged
        q, k, v, table, bias, scale)        cache's pools, no gathered copy (paged_attention.cpp)
    MODULE.DecoderState                     the fused decode step (decoder_step.cpp, qkv.kernels.fused_step)

All are one extension, built at first use by ``torch.utils.cpp_extension`` for this CPU (``-march=native``)
into ``cache_dir()/kernels``, saying so on stderr, and loaded from there silently afterwards. Its name hashes
what the binary depends on (sources, flags, torch version, CPU), and a build that fails leaves a marker under
that name (``<name>.failed``, beside where the library would be): later processes do not build again until
something in the name changes, the marker is deleted, or QKV_KERNELS_REBUILD=1.

Not attempted (``available()`` False, ``why_not()`` saying which): QKV_MATVEC=0; a CPU that is not x86-64;
macOS (Apple's clang has no -fopenmp) and Windows (the flags are GCC's and Clang's); no C++ compiler or no
``ninja``; a CPU whose vector instructions the kernels were not measured faster than oneDNN's product on
(``USED_ON``; the measurements are in docs/kernels-isa.md). Then ``qkv.kernels.linear`` uses oneDNN and
``F.linear``, and ``generate`` the inductor step.

The kernels' dot products (``dot.h``) have an AVX-512 and an AVX2 path; the AVX2 one is what a CPU without
AVX-512 builds. QKV_KERNELS_ISA=avx2 builds it on a CPU that has AVX-512 (``-mno-avx512f``): such a CPU
simulated, for tests and ``python -m benchmarks.kernels_isa``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..fileio import atomic_json
from ..runtime import cache_dir

SOURCES = tuple(Path(__file__).parent / "csrc" / f
                for f in ("matvec.cpp", "moe.cpp", "decoder_step.cpp", "paged_attention.cpp"))  # one build
HEADERS = tuple(Path(__file__).parent / "csrc" / f
                for f in ("dot.h", "activations.h", "share.h", "routing.h"))  # part of the name
# -fno-trapping-math: without it GCC leaves the activations' and softmax's exp_vec loops scalar ("control flow in
# loop": the clamps); it changes no result, only lets a comparison become a select. Part of the build's name too.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-trapping-math")
ISA_FLAGS = {"avx512": (), "avx2": ("-mno-avx512f",)}  # added to FLAGS; -mno-avx512f turns off every AVX-512 subset
ISA_NAMES = {"avx512": "AVX-512", "avx2": "AVX2"}
ISA_NEEDS = {"avx512": {"avx512f"}, "avx2": {"avx2", "fma"}}  # /proc/cpuinfo flags each needs, best first
# The vector instructions the kernels are used with: those where they measured faster than oneDNN's product
# (benchmarks/kernels_isa.py, docs/kernels-isa.md). An ISA missing here is built for tests, never used.
USED_ON = ("avx512", "avx2")
X86 = ("x86_64", "amd64", "x64")  # platform.machine(), lowered: Linux and macOS say x86_64, Windows AMD64
OFF, ISA_ENV, REBUILD_ENV = "QKV_MATVEC", "QKV_KERNELS_ISA", "QKV_KERNELS_REBUILD"
MAX_ROWS = 4  # measured: from 8 rows on, oneDNN's blocked product is as fast or faster
DTYPES = (torch.float32, torch.bfloat16)  # bf16: half the bytes, summed in fp32 (as oneDNN's bf16 product)
LOADED: bool | None = None  # None: not tried yet; read by qkv.linear (also while compiling, as a constant)
WHY_NOT = ""  # why the kernels are not available, once load() has said no
MODULE = None  # the built extension, as a Python module (qkv.kernels.fused_step's DecoderState is in it)
REGISTERED = False
LOADING = threading.Lock()


def available() -> bool:
    """Whether ``torch.ops.qkv.matvec`` (and ``MODULE.DecoderState``) can be called: builds or loads them on
    the first call."""
    global LOADED
    if LOADED is None:
        with LOADING:  # one thread builds and registers; the others wait for its answer
            if LOADED is None:
                LOADED = load()
    return LOADED


def load() -> bool:
    """Build (once per build name) and load the kernels; False where they are not for this machine (quietly) or
    cannot be built here (with one warning), ``why_not()`` saying why."""
    global WHY_NOT, MODULE
    try:
        WHY_NOT = not_for_this_machine()
        if WHY_NOT:  # by design, not a fault: why_not() and generate's fallback say it
            return False
        WHY_NOT = missing_tools() or remembered_failure()
    except ValueError as e:  # a QKV_KERNELS_ISA this CPU cannot run
        WHY_NOT = str(e)
    if not WHY_NOT:
        try:
            MODULE = compile_extension()
        except Exception as e:  # a failed build: the reference paths still work
            WHY_NOT = remember_failure(e)
    if WHY_NOT:
        warnings.warn(f"qkv: could not build its C++ kernels: {WHY_NOT}. Decoding uses oneDNN's product and "
                      "inductor instead", RuntimeWarning, stacklevel=3)
        return False
    register()
    return True


def why_not() -> str:
    """Why ``available()`` said no ("" when it said yes, or has not been asked)."""
    return WHY_NOT


def not_for_this_machine() -> str:
    """Why the kernels are not built here by design ("" where they are): turned off, a platform they cannot be
    built on, or a CPU they would not pay on."""
    if os.environ.get(OFF, "1") == "0":
        return f"{OFF}=0 turns them off"
    machine, system = platform.machine(), platform.system()
    if machine.lower() not in X86:
        return f"this CPU is {machine or 'unknown'}, not x86-64: the kernels are written for x86-64's AVX-512 and AVX2"
    if system == "Darwin":
        return "macOS: Apple's clang has no -fopenmp, which the kernels are built with"
    if system == "Windows":
        return "Windows: the kernels' build flags are GCC's and Clang's, not MSVC's"
    chosen = isa()
    if chosen is None:
        return ("no AVX-512 or AVX2 with FMA on this CPU: qkv's kernel was not measured faster than oneDNN's "
                "product there")
    if chosen not in USED_ON:
        return "no AVX-512 on this CPU: qkv's kernel would be slower than oneDNN's product"
    return ""


def missing_tools() -> str:
    """What ``torch.utils.cpp_extension`` needs (even to load a built extension: it runs ninja) that is not
    installed ("" when nothing is)."""
    from torch.utils import cpp_extension

    compiler = shlex.split(os.environ.get("CXX", "c++"))[:1] or ["c++"]
    if shutil.which(compiler[0]) is None:
        return f"no C++ compiler: {compiler[0]!r} (from $CXX, else c++) is not on PATH"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja): torch.utils.cpp_extension builds with it"
    return ""


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags from /proc/cpuinfo (Linux); empty where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())


def cpu_isas() -> list[str]:
    """The instruction sets of ``ISA_NEEDS`` this CPU has, best first."""
    flags = cpu_flags()
    return [name for name, needs in ISA_NEEDS.items() if needs <= flags]


def isa() -> str | None:
    """The vector instructions the kernels are built for: this CPU's best of AVX-512 and AVX2 (with FMA), None
    with neither; $QKV_KERNELS_ISA (avx512 or avx2) chooses one, the CPU permitting (avx2 on an AVX-512 CPU
    simulates a CPU without it)."""
    has, known = cpu_isas(), bool(cpu_flags())
    asked = os.environ.get(ISA_ENV, "")
    if not asked:
        return has[0] if has else None
    if asked not in ISA_FLAGS:
        raise ValueError(f"{ISA_ENV} must be one of {sorted(ISA_FLAGS)} or unset, got {asked!r}")
    if known and asked not in has:
        raise ValueError(f"{ISA_ENV}={asked} asks for instructions this CPU lacks (it has {has or 'neither'})")
    return asked


def flags() -> tuple[str, ...]:
    """The compiler flags of this machine's build: ``FLAGS`` and its ISA's (none when no ISA is used)."""
    chosen = isa()
    return FLAGS + (ISA_FLAGS[chosen] if chosen else ())


def compile_extension():
    """Build (first time: saying so on stderr, with how long it took) or load the extension, as a module."""
    from torch.utils import cpp_extension

    name, folder = build_name(), build_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with build_lock(folder):
        fresh = not (folder / f"{name}.so").exists()
        if fresh:
            print(f"qkv: building its C++ kernels for this CPU ({ISA_NAMES[isa()]}; once per machine and torch "
                  f"version) in {folder}", file=sys.stderr, flush=True)
        remove_left_lock(folder)
        start = time.perf_counter()
        module = cpp_extension.load(name, [str(f) for f in SOURCES], extra_cflags=list(flags()),
                                    extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=True)
    if fresh:
        print(f"qkv: built in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    failure_marker().unlink(missing_ok=True)  # a retried build that worked
    return module


@contextlib.contextmanager
def build_lock(folder: Path):
    """One qkv process at a time builds or loads in ``folder``: an ``flock``, which the system releases when its
    holder dies. torch's own lock is a file that a killed build leaves behind, and a process waiting on it imports
    a library that was never written (ImportError, remembered as a failed build): under this lock, nothing waits
    on torch's."""
    with open(folder / "qkv-build.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another process builds
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_left_lock(folder: Path) -> bool:
    """Remove torch's build lock ``folder/lock``: under ``build_lock`` no build is running, so one there was
    left by a build that was killed (Ctrl-C, a timeout), and torch would wait on it forever. True when removed."""
    lock = folder / "lock"
    if not lock.exists():
        return False
    lock.unlink(missing_ok=True)
    print(f"qkv: removed a build lock left by a build that did not finish ({lock})", file=sys.stderr, flush=True)
    return True


def failure_marker() -> Path:
    """Where a failed build of this build name is remembered: beside where its library would be."""
    return build_folder() / f"{build_name()}.failed"


def retry_hint(marker: Path) -> str:
    return f"remembered in {marker}: delete it or set {REBUILD_ENV}=1 to build again"


def remember_failure(error: Exception) -> str:
    """Write the failure's marker (atomically) and return the reason to give."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    summary = next((line for line in lines if "error" in line.lower() and "Error building" not in line), "")
    summary = f"{type(error).__name__}: {(summary or (lines or [''])[0]).strip()[:300]}"
    marker = failure_marker()
    record = {"error": summary, "first_lines": lines[:40], "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "flags": list(flags()), "isa": isa(), "torch": torch.__version__, "python": platform.python_version()}
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_json(marker, record)
    except OSError as e:
        return f"the build failed ({summary}); it could not be remembered ({type(e).__name__}: {e})"
    return f"the build failed ({summary}); {retry_hint(marker)}"


def remembered_failure() -> str:
    """The reason a build of this build name failed before ("" when none did, or QKV_KERNELS_REBUILD=1)."""
    marker = failure_marker()
    if os.environ.get(REBUILD_ENV, "0") == "1" or not marker.exists():
        return ""
    try:
        summary = json.loads(marker.read_text())["error"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        summary = f"its marker is unreadable: {type(e).__name__}"
    return f"the build failed before ({summary}); {retry_hint(marker)}"


def build_name() -> str:
    """The extension's name: one per source texts and flags (the ISA's too), torch version (its ABI changes
    between releases) and CPU (``-march=native`` code may not run on another, should a cache folder be shared)."""
    key = b"".join(f.read_bytes() for f in SOURCES + HEADERS) + " ".join(flags()).encode()
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
        torch.library.register_fake("qkv::moe_swiglu")(moe_shape)
        flop_counter.register_flop_formula(torch.ops.qkv.matvec)(linear_flops)
        REGISTERED = True


def linear_shape(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The output's shape and dtype alone, for compile's fake tensors (this op's and qkv.linear's oneDNN op)."""
    return x.new_empty(*x.shape[:-1], weight.size(0))


def moe_shape(x: Tensor, experts: Tensor, weights: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """``qkv::moe_swiglu``'s output for compile's fake tensors: x's shape (N, C)."""
    return torch.empty_like(x)


def linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """2·M·N·K for ``torch.utils.flop_counter``, which knows F.linear's matmul but not oneDNN's or this op."""
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]
