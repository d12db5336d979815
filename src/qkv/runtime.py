"""Where work runs: the device, the CPU thread count, a description of the machine, output and cache folders
(a process's place in a distributed job is ``qkv.training.distributed``).

One place for each: training, sampling, the claims and the studies all call these.
"""
from __future__ import annotations

import os
import platform
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch


AUTO: list[str] = []  # what "auto" names inside ``auto_means`` (the innermost last); empty: a GPU if any, else the CPU


@contextmanager
def auto_means(name: str) -> Iterator[torch.device]:
    """Inside, "auto" names ``name`` (checked first): a command's --device reaches the code that asks for "auto"."""
    device = resolve_device(name)
    AUTO.append(str(device))
    try:
        yield device
    finally:
        AUTO.pop()


def resolve_device(name: str = "auto", local_rank: int = 0, local_world: int = 1) -> torch.device:
    """auto | cpu | cuda | cuda:N -> a torch.device, made the current CUDA device (``torch.cuda.set_device``: the
    streams, graphs and ``torch.cuda`` calls that name no device follow it); ValueError for CUDA on a machine
    without it, a GPU index the machine lacks, or one fixed GPU for several processes of a torchrun job (each
    takes its own, ``local_gpu``)."""
    if name == "auto":
        name = AUTO[-1] if AUTO else "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {name!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use --device cpu or auto)")
    count = torch.cuda.device_count()
    if name == "cuda":
        name = f"cuda:{local_gpu(local_rank, count)}"
    elif local_world > 1:
        raise ValueError(f"--device {name} under torchrun: its {local_world} processes would share one GPU; pass "
                         "--device cuda (each process takes cuda:LOCAL_RANK)")
    if int(name[5:]) >= count:
        raise ValueError(f"--device {name}: this machine has {count} GPU(s), cuda:0 … cuda:{count - 1}")
    device = torch.device(name)
    torch.cuda.set_device(device)
    return device


def local_gpu(local_rank: int, count: int, visible: str | None = None) -> int:
    """The GPU index of torchrun's process ``local_rank`` that sees ``count`` GPUs: its own rank's; where each
    process is given one GPU alone (``visible``: CUDA_VISIBLE_DEVICES, read from the environment when None), that
    one, 0. ValueError otherwise (processes sharing one GPU, which NCCL refuses)."""
    if local_rank < count:
        return local_rank
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    if count == 1 and visible.strip():
        return 0
    raise ValueError(f"LOCAL_RANK {local_rank} sees {count} GPU(s): give each process its own GPU (as many "
                     "visible GPUs as processes per machine, or CUDA_VISIBLE_DEVICES set to one GPU per process)")


def device_type(name: str = "auto") -> str:
    """"cuda" or "cpu": where ``name`` runs (no checks; ``resolve_device`` refuses a bad name)."""
    if name == "auto":
        name = AUTO[-1] if AUTO else "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if name.startswith("cuda") else "cpu"


# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) from which its bf16 products run in hardware (AVX-512 BF16 and up);
# ATen's vector levels (ATEN_CPU_CAPABILITY) below AVX-512.
ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2",
                    "ALL", "DEFAULT")
ATEN_BELOW_AVX512 = ("default", "avx2")


def cpu_bf16_capped(env: dict | None = None) -> str | None:
    """Why this process cannot use the CPU's bf16 instructions though the CPU has them: ONEDNN_MAX_CPU_ISA or
    ATEN_CPU_CAPABILITY set below AVX-512 BF16 (what an AVX2 machine runs like); None when neither caps it."""
    env = os.environ if env is None else env
    isa = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and isa not in ONEDNN_BF16_ISAS:
        return f"ONEDNN_MAX_CPU_ISA={isa}"
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ATEN_BELOW_AVX512:
        return f"ATEN_CPU_CAPABILITY={aten}"
    return None


def native_bf16(device: str = "auto") -> bool:
    """``device`` (auto | cpu | cuda[:N]) computes bfloat16 products natively: a GPU of compute capability 8.0 or
    more (``cuda_bf16``), or a CPU with AVX-512 BF16 or AMX tiles that this process may use (``cpu_bf16_capped``),
    where bf16 matrix products beat fp32's (elsewhere bf16 is emulated, slower)."""
    if device != "cpu" and torch.cuda.is_available():
        return cuda_bf16(device)
    if cpu_bf16_capped() is not None:
        return False
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe() for probe in probes if probe is not None)  # torch.cpu's probes; absent in old torch: False


def cuda_bf16(device: str = "cuda") -> bool:
    """The GPU ``device`` (cuda | cuda:N | auto: the current one) has bf16 tensor cores: compute capability 8.0
    (Ampere) or more. ``torch.cuda.is_bf16_supported()`` says True on a V100 or T4 too, where bf16 is emulated."""
    index = int(device[5:]) if device.startswith("cuda:") else None
    return torch.cuda.get_device_capability(index) >= (8, 0)


DTYPES = ("auto", "float32", "bfloat16", "float16")  # the weights' type a loader or a command's --dtype takes


def resolve_dtype(dtype: torch.dtype | str = "auto", device: str = "auto") -> torch.dtype:
    """A floating ``torch.dtype`` for ``dtype``: one of ``DTYPES`` or a floating dtype; "auto" is bfloat16 where
    ``device`` computes it natively (``native_bf16``), float32 elsewhere. TypeError/ValueError otherwise."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} or a floating torch.dtype, got {dtype!r}")
    if dtype == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return getattr(torch, dtype)


def bf16_words(device: str = "auto") -> str:
    """Why ``native_bf16(device)`` says what it says, in a few words (a run's summary records them)."""
    if device != "cpu" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        native = "native" if cuda_bf16(device) else "emulated (compute capability below 8.0)"
        return f"{torch.cuda.get_device_name()} (compute capability {major}.{minor}): bf16 {native}"
    capped = cpu_bf16_capped()
    if capped:
        return f"CPU capped by {capped}: bf16 emulated"
    return "CPU with AVX-512 BF16 or AMX: bf16 native" if native_bf16("cpu") else "CPU without AVX-512 BF16 or AMX: bf16 emulated"


@dataclass(frozen=True)
class CpuTimes:
    """One reading of the kernel's CPU counters (clock ticks, /proc/stat and /proc/self/stat)."""

    total: int  # ticks of every CPU, all states
    idle: int  # ticks spent idle or waiting for I/O
    own: int  # ticks this process spent running (user + system, all its threads)
    cpus: int  # CPUs the counters cover


def cpu_times(allowed: set[int] | None = None) -> CpuTimes | None:
    """The CPU counters now, summed over the CPUs in ``allowed`` (None: all); None where /proc/stat is missing."""
    try:
        stat = Path("/proc/stat").read_text().splitlines()
        own = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    total = idle = cpus = 0
    for line in stat:
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and (allowed is None or int(name[3:]) in allowed):
            ticks = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
            total, idle, cpus = total + sum(ticks), idle + ticks[3] + ticks[4], cpus + 1
    fields = own[own.rindex(")") + 2:].split()  # the process name may hold spaces: fields from the 3rd on
    return CpuTimes(total=total, idle=idle, own=int(fields[11]) + int(fields[12]), cpus=max(1, cpus))


def free_cores(before: CpuTimes, after: CpuTimes) -> float:
    """CPUs that other processes left idle between two readings (this process's own time counts as free)."""
    total = after.total - before.total
    if total <= 0:
        return float(after.cpus)
    others = total - (after.idle - before.idle) - (after.own - before.own)
    return after.cpus * (1 - min(total, max(0, others)) / total)


def cpu_threads(window: float = 0.25) -> int:
    """Threads for CPU work: the cores that other processes leave free now (at least one).

    On a busy machine OpenMP's threads wait on each other at every operation, so threads on cores that
    other jobs share run slower than fewer threads. What is free is read from the kernel's counters over
    ``window`` seconds, not counting this process's own work (a load average lags by a minute, and qkv's
    own data preparation raises it just before training); where those counters are missing, from the
    1-minute load average. OMP_NUM_THREADS wins if set.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = len(allowed) if allowed else (os.cpu_count() or 1)
    before = cpu_times(allowed)
    if before is None:
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return max(1, min(cores, round(cores - busy)))
    time.sleep(window)
    return max(1, min(cores, round(free_cores(before, cpu_times(allowed) or before))))


@contextmanager
def fixed_threads(n: int | None = None) -> Iterator[int]:
    """Run on ``n`` intra-op CPU threads (None: ``cpu_threads()``), restoring the caller's count after."""
    before = torch.get_num_threads()
    n = n or cpu_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def cache_dir() -> Path | None:
    """Where encoded corpora, fitted tokenizers and built kernels are kept: $QKV_CACHE_DIR, else ~/.cache/qkv
    ($XDG_CACHE_HOME respected); QKV_CACHE_DIR=off turns the cache off."""
    env = os.environ.get("QKV_CACHE_DIR")
    if env == "off":
        return None
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qkv"


def use_compile_cache() -> None:
    """Keep inductor's compiled code in qkv's cache (``cache_dir()/inductor``), so that a later run of the same
    model and shapes loads its kernels instead of compiling them again. A TORCHINDUCTOR_CACHE_DIR the user set
    is left alone, and so is inductor's own temporary folder when qkv's cache is off."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    root, current = cache_dir(), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is not None and current in (None, os.path.abspath(default_cache_dir())):  # importing dynamo sets the
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")  # default: not the user's choice


@contextmanager
def deterministic_kernels() -> Iterator[None]:
    """torch's deterministic algorithms inside (warnings, not errors, where an op has none; the caller's setting
    restored after). Inductor compiles under it: an accumulating index_put (an embedding's backward) goes to
    ATen's kernel instead of one whose CPU threads add into shared rows atomically, in an order that changes
    from run to run, so a compiled run on more than one thread is reproducible and resumes bit for bit."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@contextmanager
def tf32_kept() -> Iterator[None]:
    """Whatever is switched inside, the caller's TF32 switches (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``) restored after: a run that turns TF32 on leaves the process as it was."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def machine() -> str:
    """A one-line description of where a measurement ran."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    return (f"{dev}; {cpu}, {os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads; "
            f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}")


def source_commit() -> str:
    """The git commit qkv's source was loaded from, with "+changes" when the tracked files differ from it;
    "unknown" outside a git checkout (an installed wheel)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def prepare_output_dir(out: str | os.PathLike | None, outputs: Iterable[str], *, overwrite: bool,
                       what: str = "results") -> Path | None:
    """Check (and create) a folder for a command's ``outputs`` before any work: refuse a file in its
    place, and a folder that already holds some of them unless ``overwrite``."""
    if out is None:
        return None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    taken = sorted(name for name in outputs if (out / name).exists())
    if taken and not overwrite:
        raise ValueError(f"{out} already holds {what} ({', '.join(taken[:3])}); "
                         "pass --overwrite to replace them or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out
