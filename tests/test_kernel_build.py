"""qkv.kernels.build: where the C++ kernels are built, what a failed build leaves behind, which instruction set
they are built for, what the first build says. ``torch.utils.cpp_extension.load`` is mocked (no compiler runs)
except in the last test, which builds the AVX2 variant for real in its own cache folder."""
import json
import os
import platform
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from unittest import mock

import pytest
from torch.utils import cpp_extension

from qkv.kernels import build

AVX512 = {"avx2", "fma", "avx512f"}  # /proc/cpuinfo flags, as build.cpu_flags reads them
AVX2 = {"avx2", "fma"}
MISSING_TOOLS = build.missing_tools  # the real one, which the fixture replaces


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A "new process": the module's state reset (and restored afterwards), its own cache folder, an x86-64
    Linux machine with AVX-512 and the tools, and ``load`` mocked. Returns the mock."""
    for name in ("LOADED", "WHY_NOT", "MODULE"):
        monkeypatch.setattr(build, name, getattr(build, name))
    monkeypatch.setattr(build, "LOADED", None)
    monkeypatch.setattr(build, "register", lambda: None)  # the mock's op is not torch's to register
    for var in (build.OFF, build.ISA_ENV, build.REBUILD_ENV, "CXX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(build, "cpu_flags", lambda: set(AVX512))
    monkeypatch.setattr(build, "missing_tools", lambda: "")
    load = mock.Mock(return_value=object())
    monkeypatch.setattr(cpp_extension, "load", load)
    return load


def new_process(monkeypatch):
    monkeypatch.setattr(build, "LOADED", None)


ERROR = RuntimeError("Error building extension 'qkv_matvec_x':\n[1/3] c++ -MMD -MF matvec.o.d -O3 ...\n"
                     "matvec.cpp:12:3: error: 'foo' was not declared in this scope\nninja: build stopped")


def test_a_failed_build_is_remembered_and_not_retried(fresh, monkeypatch):
    fresh.side_effect = ERROR
    with pytest.warns(RuntimeWarning, match="could not build its C\\+\\+ kernels") as said:
        assert build.available() is False
    marker = build.failure_marker()
    record = json.loads(marker.read_text())
    assert "error: 'foo' was not declared" in record["error"] and record["flags"] == list(build.flags())
    assert record["when"] and record["isa"] == "avx512" and str(marker) in str(said[0].message)
    assert not re.search(r"\d+(\.\d+)?x\b", str(said[0].message))  # no measured figures in the warning

    new_process(monkeypatch)
    with pytest.warns(RuntimeWarning) as said:
        assert build.available() is False
    assert fresh.call_count == 1 and len(said) == 1  # not built again; said once in this process
    assert "failed before" in build.why_not() and str(marker) in build.why_not()
    assert f"{build.REBUILD_ENV}=1" in build.why_not() and "delete it" in build.why_not()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build.available() is False  # the answer is kept: no second warning, no second look


def test_the_rebuild_variable_retries_and_a_success_clears_the_marker(fresh, monkeypatch):
    fresh.side_effect = ERROR
    with pytest.warns(RuntimeWarning):
        build.available()
    monkeypatch.setenv(build.REBUILD_ENV, "1")
    fresh.side_effect = None
    new_process(monkeypatch)
    assert build.available() is True and fresh.call_count == 2
    assert not build.failure_marker().exists() and build.why_not() == ""


def test_a_changed_build_name_builds_again(fresh, monkeypatch):
    """The marker belongs to one build name (sources, flags, torch, CPU): another name is another build."""
    fresh.side_effect = ERROR
    with pytest.warns(RuntimeWarning):
        build.available()
    first = build.failure_marker()
    monkeypatch.setenv(build.ISA_ENV, "avx2")
    new_process(monkeypatch)
    with pytest.warns(RuntimeWarning):
        build.available()
    assert fresh.call_count == 2 and build.failure_marker() != first and build.failure_marker().exists()


@pytest.mark.parametrize("machine, system, reason", [
    ("aarch64", "Linux", "not x86-64"), ("arm64", "Darwin", "not x86-64"), ("ppc64le", "Linux", "not x86-64"),
    ("x86_64", "Darwin", "macOS: Apple's clang has no -fopenmp"), ("AMD64", "Windows", "Windows"),
])
def test_not_attempted_where_it_cannot_work(fresh, monkeypatch, machine, system, reason):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "system", lambda: system)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # by design, not a fault: quiet
        assert build.available() is False
    assert reason in build.why_not() and fresh.call_count == 0


def test_no_compiler_is_not_attempted(fresh, monkeypatch):
    monkeypatch.setattr(build, "missing_tools", MISSING_TOOLS)
    monkeypatch.setenv("CXX", "/nonexistent/qkv-test-c++")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert build.available() is False
    assert "/nonexistent/qkv-test-c++" in build.why_not() and fresh.call_count == 0
    assert not build.failure_marker().exists()  # nothing to remember: it was not tried


def test_the_instruction_set_and_its_build_name(fresh, monkeypatch):
    assert build.isa() == "avx512" and "-mno-avx512f" not in build.flags()
    with_avx512 = build.build_name()
    monkeypatch.setenv(build.ISA_ENV, "avx2")  # a CPU without AVX-512, simulated
    assert build.isa() == "avx2" and build.flags()[-1] == "-mno-avx512f"
    assert build.build_name() != with_avx512
    monkeypatch.delenv(build.ISA_ENV)
    monkeypatch.setattr(build, "cpu_flags", lambda: set(AVX2))  # a real one
    assert build.isa() == "avx2" and build.flags()[-1] == "-mno-avx512f"
    assert build.available() is True
    args, kwargs = fresh.call_args
    assert kwargs["extra_cflags"] == list(build.FLAGS) + ["-mno-avx512f"]


def test_without_avx512_it_is_used_only_where_it_measured_faster(fresh, monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda: set(AVX2))
    monkeypatch.setattr(build, "USED_ON", ("avx512",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build.available() is False
    assert build.why_not() == "no AVX-512 on this CPU: qkv's kernel would be slower than oneDNN's product"
    monkeypatch.setattr(build, "cpu_flags", lambda: {"sse4_2", "avx"})  # neither AVX-512 nor AVX2
    new_process(monkeypatch)
    assert build.available() is False and "no AVX-512 or AVX2" in build.why_not() and fresh.call_count == 0


def test_an_instruction_set_asked_for_is_checked(fresh, monkeypatch):
    monkeypatch.setenv(build.ISA_ENV, "sse")
    with pytest.raises(ValueError, match=r"one of \['avx2', 'avx512'\] or unset, got 'sse'"):
        build.isa()
    monkeypatch.setenv(build.ISA_ENV, "avx512")
    monkeypatch.setattr(build, "cpu_flags", lambda: set(AVX2))
    with pytest.warns(RuntimeWarning, match="asks for instructions this CPU lacks"):
        assert build.available() is False
    assert fresh.call_count == 0


def test_the_first_build_says_what_and_how_long_then_loads_quietly(fresh, capsys):
    def built(name, sources, build_directory, **kwargs):
        (Path(build_directory) / f"{name}.so").write_bytes(b"")
        return object()

    fresh.side_effect = built
    assert build.available() is True
    err = capsys.readouterr().err
    assert "qkv: building its C++ kernels for this CPU (AVX-512; " in err and str(build.build_folder()) in err
    assert re.search(r"^qkv: built in \d+\.\d s$", err, re.M)
    build.LOADED = None  # the next process: the library is there (the fixture restores LOADED)
    assert build.available() is True and fresh.call_count == 2
    assert capsys.readouterr().err == ""


REAL_BUILD = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from qkv.kernels import build
    assert build.available(), build.why_not()
    assert build.isa() == "avx2" and "-mno-avx512f" in build.flags()
    for rows, n, k in [(1, 7, 5), (1, 64, 128), (2, 33, 130), (4, 96, 64), (3, 17, 200)]:
        x, w, b = torch.randn(rows, k), torch.randn(n, k), torch.randn(n)
        torch.testing.assert_close(torch.ops.qkv.matvec(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.ops.qkv.matvec(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-5)
    print("ok")
""")


@pytest.mark.skipif(platform.machine().lower() not in build.X86 or platform.system() != "Linux"
                    or not AVX2 <= build.cpu_flags() or build.missing_tools() != "",
                    reason="needs x86-64 Linux with AVX2 and a C++ compiler")
def test_the_avx2_variant_builds_and_equals_f_linear(tmp_path):
    """Built for real in a subprocess (its op name is the one this process may have registered already)."""
    env = os.environ | {"QKV_CACHE_DIR": str(tmp_path), build.ISA_ENV: "avx2", "OMP_NUM_THREADS": "2",
                        "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop(build.OFF, None)
    done = subprocess.run([sys.executable, "-c", REAL_BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert "building its C++ kernels for this CPU (AVX2" in done.stderr and "qkv: built in" in done.stderr


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path, capsys):
    lock = tmp_path / "lock"
    lock.touch()
    assert build.remove_left_lock(tmp_path) and not lock.exists()
    assert "removed a build lock" in capsys.readouterr().err
    assert not build.remove_left_lock(tmp_path)  # none there


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from qkv.kernels import build
    print("waiting", flush=True)
    with build.build_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def test_one_process_builds_at_a_time_and_a_dead_holder_frees_the_lock(tmp_path):
    """A second process waits while the first holds the lock; once the holder is killed (as a timeout kills a
    build), the lock is free at once: nothing is left behind to wait on."""
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    run = [sys.executable, "-c", HOLD_LOCK, str(tmp_path)]
    holder = subprocess.Popen(run + ["120"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split() == ["waiting"] and holder.stdout.readline().strip() == "held"
        with pytest.raises(subprocess.TimeoutExpired) as waited:
            subprocess.run(run + ["0"], env=env, capture_output=True, text=True, timeout=45)
        assert (waited.value.stdout or b"").split() in ([b"waiting"], ["waiting"])  # started, never held it
    finally:
        holder.kill()
        holder.wait()
    done = subprocess.run(run + ["0"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["waiting", "held"]


def test_the_load_runs_under_the_lock_with_no_left_lock(fresh):
    """torch's lock file, left by a killed build, is gone before torch's load looks for it."""
    folder = build.build_folder()
    folder.mkdir(parents=True)
    (folder / "lock").touch()
    fresh.side_effect = lambda *a, **k: (not (folder / "lock").exists()) or pytest.fail("torch's lock was left")
    assert build.available() is True
