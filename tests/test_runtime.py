"""qkv.runtime.cpu_threads: the cores other processes leave free, read from mocked kernel counters."""
from pathlib import Path

import pytest
import torch

from qkv import runtime


def stat(*cpus: tuple[int, int]) -> str:
    """A /proc/stat whose CPU i has spent cpus[i] = (busy, idle) ticks."""
    lines = [f"cpu  {sum(b for b, _ in cpus)} 0 0 {sum(i for _, i in cpus)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (busy, idle) in enumerate(cpus)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


def own(ticks: int) -> str:
    """A /proc/self/stat whose process (a name with a space and a parenthesis) ran ``ticks`` (utime + stime)."""
    return f"42 (python (x) y) S 1 42 42 0 -1 0 0 0 0 0 {ticks - ticks // 2} {ticks // 2} 0 0 20 0 1 0\n"


@pytest.fixture
def kernel(monkeypatch):
    """Feed cpu_threads two readings of /proc/stat and /proc/self/stat (before and after its window)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime.time, "sleep", lambda s: None)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)

    def feed(readings: list[tuple[str, str]]):
        files = {"/proc/stat": iter(r[0] for r in readings), "/proc/self/stat": iter(r[1] for r in readings)}
        monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: next(files[str(self)]))
    return feed


# 4 CPUs, 100 ticks each over the window; (busy, idle) added per CPU, and this process's own ticks
@pytest.mark.parametrize("busy, own_ticks, expected", [
    ((0, 0, 0, 0), 0, 4),  # idle machine: every core
    ((100, 0, 0, 0), 0, 3),  # one core kept busy by another process
    ((100, 100, 100, 40), 0, 1),  # nearly all busy: one thread, never zero
    ((100, 100, 100, 100), 0, 1),
    ((100, 100, 0, 0), 200, 4),  # the busy cores are this process's own work: all free
    ((100, 100, 100, 0), 100, 2),  # one core ours, two another's
])
def test_cpu_threads_counts_the_cores_others_leave_free(kernel, busy, own_ticks, expected):
    start = [(1000, 5000)] * 4
    end = [(b0 + b, i0 + 100 - b) for (b0, i0), b in zip(start, busy)]
    kernel([(stat(*start), own(50)), (stat(*end), own(50 + own_ticks))])
    assert runtime.cpu_threads() == expected


def test_cpu_threads_reads_only_the_cpus_it_may_run_on(kernel, monkeypatch):
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    start = [(0, 0)] * 4
    kernel([(stat(*start), own(0)), (stat((100, 0), (100, 0), (0, 100), (0, 100)), own(0))])
    assert runtime.cpu_threads() == 2  # cpu0 and cpu1 busy, but not ours to use


def test_cpu_threads_falls_back_to_the_load_average(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "cpu_times", lambda allowed=None: None)  # no /proc/stat
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for load, expected in [(0.1, 4), (1.2, 3), (3.6, 1), (9.0, 1)]:
        monkeypatch.setattr(runtime.os, "getloadavg", lambda load=load: (load, load, load))
        assert runtime.cpu_threads() == expected


def test_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(runtime, "cpu_times", lambda allowed=None: pytest.fail("read /proc/stat despite OMP"))
    assert runtime.cpu_threads() == torch.get_num_threads()


def test_compiled_kernels_go_to_qkvs_cache_unless_the_user_chose(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    for before, after in [(None, tmp_path / "inductor"), (default_cache_dir(), tmp_path / "inductor"),
                          ("/mine", "/mine")]:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        if before is not None:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", before)
        runtime.use_compile_cache()
        assert runtime.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(after)
    monkeypatch.setenv("QKV_CACHE_DIR", "off")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    runtime.use_compile_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in runtime.os.environ


@pytest.mark.parametrize("env, capped", [
    ({}, None), ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "ONEDNN_MAX_CPU_ISA=AVX512_CORE"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None), ({"ONEDNN_MAX_CPU_ISA": "ALL"}, None),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "ATEN_CPU_CAPABILITY=avx2"), ({"ATEN_CPU_CAPABILITY": "avx512"}, None)])
def test_bf16_capped_by_the_isa_variables(env, capped):
    from qkv.runtime import cpu_bf16_capped

    assert cpu_bf16_capped(env) == capped


def test_native_bf16_honours_the_isa_cap(monkeypatch):
    from qkv import runtime

    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert runtime.native_bf16() is False and "capped by ONEDNN_MAX_CPU_ISA=AVX2" in runtime.bf16_words()
