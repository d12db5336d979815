"""The run directory: one writer at a time, a full disk, file modes, the training state's round trip.

Each of the three faults was reproduced on the code before RunDir: a second `--resume` writer was
accepted and mixed checkpoints; a full disk ended with torch's "unexpected pos" message; files
were created 0600.
"""
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch

from qkv.training import run_dir as ckpt
from qkv import fileio
from qkv.training.run_dir import RunDir, RunLocked
from qkv.cli import main
from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.training.recipe import Recipe, TrainConfig, TrainState, train
from qkv.training.distributed import Dist

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
CORPUS = Corpus(train=TEXT[:-2000], val=TEXT[-2000:], source="test")
ARGS = ["--preset", "tiny", "--tokenizer", "char", "--context", "32", "--batch-size", "4", "--eval-interval", "5",
        "--seed", "3", "--threads", "1", "--device", "cpu", "--quiet", "--sample-tokens", "0"]


def cfg(**kw) -> TrainConfig:
    model = ModelConfig(d_model=32, attention=dict(num_heads=2), position=dict(kind="rope"), num_layers=2, max_len=32)
    base = dict(model=model, max_steps=6, batch_size=4, eval_interval=2, eval_windows=4, progress=False,
                final_eval=False, threads=1)
    return TrainConfig(**(base | kw))


# --- one writer --------------------------------------------------------------------------------

def test_a_second_writer_is_refused_naming_the_first(data, tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "qkv", "train", *ARGS, "--data", str(data),
                              "--max-steps", "100000", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "train_state.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "qkv", "train", "--resume", "--out", str(out), "--quiet",
                                 "--sample-tokens", "0"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"process {first.pid}" in lines[0] and "one writer" in lines[0], lines
    finally:
        first.send_signal(signal.SIGKILL)  # the OS releases a flock when its holder dies, even by SIGKILL
        first.wait(timeout=60)
    with RunDir(out).lock():  # so the next writer gets it
        pass


def test_lock_is_exclusive_in_process_and_released(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock():
        assert (run / run.LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(RunLocked, match=f"process {os.getpid()}"):
            with RunDir(run.path).lock():
                pass
    assert not (run / run.LOCK).exists()  # released and removed
    with run.lock():
        pass


def test_bad_settings_leave_no_directory_behind(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="batch_size"):
        train(cfg(out=str(out), batch_size=3, grad_accum=2), corpus=CORPUS)
    assert not out.exists()


# --- a full disk -------------------------------------------------------------------------------

def small_filesystem(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (needs root and a kernel that allows it), else None."""
    path.mkdir(parents=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return None
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return path if res.returncode == 0 else None


def test_a_full_disk_says_so_keeps_the_last_checkpoint_and_resumes(tmp_path, capsys):
    model = ["--preset", "tiny", "--tokenizer", "char", "--context", "32", "--batch-size", "4", "--eval-interval", "2",
             "--seed", "3", "--threads", "1", "--device", "cpu", "--quiet", "--sample-tokens", "0"]
    data = tmp_path / "text.py"
    data.write_text(TEXT, encoding="utf-8")
    disk = small_filesystem(tmp_path / "disk", "4m")
    if disk is None:
        pytest.skip("mounting a small tmpfs needs root; test_simulated_enospc covers the same path")
    try:
        out = disk / "run"
        argv = ["train", *model, "--data", str(data), "--max-steps", "40", "--out", str(out)]
        # Fill the disk so that a checkpoint fits once, but not twice.
        assert main([*argv, "--max-steps", "2"]) == 0
        used = sum(p.stat().st_size for p in out.iterdir())
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * max(0, free - used // 2))
        shutil.rmtree(out)
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert "the disk is full" in err[0] and str(out) in err[0] and "unexpected pos" not in err[0], err
        step = ckpt.load_train_state(out)["step"]
        assert step > 0 and f"step {step}" in err[0]
        ckpt.load_run(out)  # the last complete checkpoint loads
        (disk / "filler").unlink()  # free the space, then resume
        assert main(["train", "--resume", "--out", str(out), "--quiet", "--sample-tokens", "0"]) == 0
        assert ckpt.load_train_state(out)["step"] == 40
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_simulated_enospc_at_the_write(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real, calls = fileio.os.fsync, [0]

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and ".train_state.pt." in os.readlink(f"/proc/self/fd/{fd}"):
            calls[0] += 1
            if calls[0] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    with pytest.raises(ValueError, match=r"the disk is full: could not write .*train_state.pt.*\(step 2\) is kept"):
        train(cfg(out=str(out), max_steps=8), corpus=CORPUS)
    assert ckpt.load_train_state(out)["step"] == 2 and not list(out.glob(".*.tmp"))
    monkeypatch.setattr(fileio.os, "fsync", real)
    r = train(TrainConfig.for_resume(out, progress=False), corpus=CORPUS)
    assert r.summary["steps"] == 8


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("Error while serializing: I/O error: No space left on device "
                                                "(os error 28)")])  # safetensors' wording
def test_disk_full_is_recognised_whatever_the_writer_raises(tmp_path, error):
    def write(tmp):
        tmp.write_bytes(b"partial")
        raise error

    (tmp_path / "x.bin").write_bytes(b"old")
    with pytest.raises(fileio.DiskFullError, match="the disk is full: could not write .*x.bin"):
        fileio.atomic_via(tmp_path / "x.bin", write)
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"] and (tmp_path / "x.bin").read_bytes() == b"old"


# --- file modes --------------------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_honour_the_umask(tmp_path, umask):
    before = os.umask(umask)
    try:
        out = tmp_path / "run"
        train(cfg(out=str(out), final_eval=True), corpus=CORPUS)
    finally:
        os.umask(before)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes and set(modes.values()) == {0o666 & ~umask}, modes


# --- the training state ----------------------------------------------------------------------

def test_train_state_round_trips_every_field(tmp_path):
    recipe = Recipe(cfg(out=str(tmp_path / "run"), max_steps=100), Dist())
    recipe.setup()
    loop = recipe.loop
    loop.state = TrainState(step=7, elapsed=1.5, train_time=1.25, tokens=896, running=[3.5, 2], eval_cost=0.01)
    recipe.engine.opt.step()  # some optimizer state
    recipe.run.path.mkdir(parents=True)
    recipe.checkpoints.begin_writing(loop.records)
    loop.save()
    saved = TrainState.from_dict(recipe.run.load_state(), where="test")
    captured = recipe.checkpoints.capture_state(loop.state, loop.batch_gen)
    for f in fields(TrainState):
        a, b = getattr(saved, f.name), getattr(captured, f.name)
        assert a is not None or f.name in ("cuda_rng", "sharded"), f"{f.name} was not saved"  # no CUDA, no fsdp
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
        elif f.name not in ("model", "optimizer"):
            assert a == b, f.name
    fresh = Recipe(cfg(out=str(tmp_path / "run"), max_steps=100, resume=True), Dist())
    fresh.setup()
    fresh.restore(saved)
    assert asdict(fresh.loop.state) | {"model": None, "optimizer": None} == asdict(loop.state) | {"model": None,
                                                                                                   "optimizer": None}


def test_train_state_refuses_a_foreign_dict():
    with pytest.raises(ValueError, match="not a qkv training state"):
        TrainState.from_dict({"step": 1, "model": {}, "optimizer": {}, "surprise": 1}, where="x")
