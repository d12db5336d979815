"""The Makefile's promises, read from what `make -n` would run (nothing is installed or trained here):
torch is installed as TORCH_SPEC from TORCH_INDEX_URL when one is given, and `make demo` never replaces
an earlier demo run."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry_run(*args: str) -> list[str]:
    done = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def torch_line(*variables: str) -> str:
    lines = [line for line in dry_run(".venv/.installed", *variables) if "pip install" in line and "torch" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_torch_is_pinned_and_pip_decides_the_index_by_default():
    line = torch_line()
    assert line.endswith("'torch==2.13.0'") and "--index-url" not in line


def test_torch_index_url_and_spec_choose_the_build():
    line = torch_line("TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu", "TORCH_SPEC=torch==2.5.1")
    assert "--index-url https://download.pytorch.org/whl/cpu 'torch==2.5.1'" in line
    assert "-e '.[dev]'" not in line  # the index applies to torch only, not to qkv's other dependencies


def test_demo_keeps_an_earlier_run_and_samples_from_the_newest():
    lines = " ".join(dry_run("demo"))
    assert "qkv train --preset demo" in lines and "--overwrite" not in lines and "--out" not in lines
    assert 'qkv sample --run "$(ls -td runs/demo runs/demo-[0-9]*' in lines


def test_demo_samples_from_the_run_just_written(tmp_path):
    """The shell expression `make demo` hands to `qkv sample --run`, run where runs/demo and runs/demo-2
    exist: it names the newer one."""
    line = " ".join(dry_run("demo"))
    expression = line[line.index('"$(') + 1: line.index(')"') + 1]
    for name, age in (("demo", 60), ("demo-2", 0), ("demo-10", 30)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        os.utime(tmp_path / "runs" / name, (time.time() - age,) * 2)
    chosen = subprocess.run(["sh", "-c", f"echo {expression}"], cwd=tmp_path, capture_output=True, text=True)
    assert chosen.stdout.strip() == "runs/demo-2"
