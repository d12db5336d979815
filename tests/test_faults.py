"""Faults injected into real training runs: SIGKILL at several points, Ctrl-C, a NaN loss.

Every checkpoint left on disk loads (atomic writes); a resumed run ends with exactly the
weights of an uninterrupted run with the same seed.
"""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from qkv.training import run_dir as ckpt
from qkv.cli import main

ARGS = ["--preset", "tiny", "--tokenizer", "char", "--context", "32", "--batch-size", "4", "--eval-interval", "10",
        "--seed", "3", "--threads", "1", "--device", "cpu", "--quiet", "--sample-tokens", "0"]
STEPS = "30"

# Runs `qkv train` in a fresh process that SIGKILLs itself at the chosen point.
KILLER = r"""
import os, signal, sys
from qkv.training import run_dir as ckpt
from qkv.training import loop as tr  # the loop calls train_step from there
from qkv.cli import main
point, argv = sys.argv[1], sys.argv[2:]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point.startswith("step:"):  # before the optimizer step numbered N (1-based)
    n, real, calls = int(point[5:]), tr.train_step, [0]
    def step(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            die()
        return real(*a, **k)
    tr.train_step = step
elif point == "between-files":  # 2nd checkpoint: model.safetensors renamed, train_state.pt not yet written
    real, calls = ckpt.RunDir.save_state, [0]
    def save(*a, **k):
        calls[0] += 1
        if calls[0] == 2:
            die()
        return real(*a, **k)
    ckpt.RunDir.save_state = save
elif point == "mid-write":  # 2nd checkpoint: train_state.pt's temporary file half written, never renamed
    import contextlib
    from qkv import fileio
    real, calls = fileio.atomic_path, [0]
    @contextlib.contextmanager
    def path(target):
        with real(target) as tmp:
            yield tmp
            if os.path.basename(target) == "train_state.pt":
                calls[0] += 1
                if calls[0] == 2:
                    with open(tmp, "r+b") as f:
                        f.truncate(os.path.getsize(tmp) // 2)
                    die()
    fileio.atomic_path = path
sys.exit(main(argv))
"""


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The uninterrupted run's final weights."""
    out = tmp_path_factory.mktemp("ref") / "run"
    res = subprocess.run([sys.executable, "-m", "qkv", "train", *ARGS, "--data", str(data), "--max-steps", STEPS,
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return load_file(out / "model.safetensors")


def everything_on_disk_loads(out):
    if (out / "model.safetensors").exists():
        ckpt.load_run(out)
    if (out / "train_state.pt").exists():
        ckpt.load_train_state(out)


@pytest.mark.parametrize("point", ["step:5", "step:15", "between-files", "mid-write"])
def test_sigkill_then_resume_gives_the_uninterrupted_weights(point, data, reference, tmp_path):
    out = tmp_path / "run"
    argv = ["train", *ARGS, "--data", str(data), "--max-steps", STEPS, "--out", str(out)]
    killed = subprocess.run([sys.executable, "-c", KILLER, point, *argv], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    everything_on_disk_loads(out)
    resumed = subprocess.run([sys.executable, "-m", "qkv", "train", "--resume", "--out", str(out), "--quiet",
                              "--threads", "1", "--sample-tokens", "0"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    if point == "step:5":
        assert "no checkpoint yet" in resumed.stderr and "step 0" in resumed.stderr
    final = load_file(out / "model.safetensors")
    assert final.keys() == reference.keys()
    for name, t in reference.items():
        assert torch.equal(final[name], t), name
    assert json.loads((out / "summary.json").read_text())["steps"] == int(STEPS)


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(data, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "train", *ARGS, "--data", str(data), "--max-steps", "100000",
                             "--out", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "train_state.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("qkv: interrupted at step") and "checkpoint saved" in line and "Traceback" not in err
    step = int(line.split("step ")[1].split(",")[0])
    assert ckpt.load_train_state(out)["step"] == step and ckpt.weights_step(out) == step
    everything_on_disk_loads(out)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data, tmp_path, capsys, monkeypatch):
    from qkv.training import loop as tr  # the loop calls train_step from there

    real, calls = tr.train_step, [0]

    def poisoned(*a, **k):
        loss = real(*a, **k)
        calls[0] += 1
        return loss * float("nan") if calls[0] == 14 else loss

    monkeypatch.setattr(tr, "train_step", poisoned)
    out = tmp_path / "run"
    assert main(["train", *ARGS, "--data", str(data), "--max-steps", STEPS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "became nan at step 14" in err[0] and "step 10" in err[0], err
    assert ckpt.load_train_state(out)["step"] == 10 and ckpt.weights_step(out) == 10
    everything_on_disk_loads(out)
