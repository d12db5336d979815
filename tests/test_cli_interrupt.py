"""Ctrl-C outside training: one line saying so, exit 130; `qkv sample` streams its text, and Ctrl-C keeps
what it printed (ended by a newline). An absurd --max-new-tokens is capped, saying why."""
import importlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qkv import cli

FAST = ["--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-interval", "2", "--quiet",
        "--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "r"
    n = torch.get_num_threads()
    try:
        assert cli.main(["train", *FAST, "--data", str(data), "--max-steps", "2", "--out", str(out),
                         "--sample-tokens", "0"]) == 0
    finally:
        torch.set_num_threads(n)
    return out


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("target, argv", [
    ("qkv.cli.train.load_model_source", ["sample", "--run", "R", "--prompt", "def"]),
    ("qkv.cli.translate.load_model_source", ["translate", "--run", "R", "a text"]),
    ("qkv.claims.run_claims", ["verify", "--only", "softmax-rows"]),
    ("qkv.cli.sources.load_model_source", ["explore", "--run", "R", "--text", "a"]),
])
def test_ctrl_c_is_one_line_and_exit_130(target, argv, run, monkeypatch, capsys):
    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, interrupt)
    assert cli.main([str(run) if a == "R" else a for a in argv]) == 130
    assert capsys.readouterr().err == "qkv: interrupted\n"


def test_sample_interrupted_keeps_what_it_printed(run, monkeypatch, capsys):
    decode = importlib.import_module("qkv.generation.decode")
    real, calls = decode.next_token, []

    def five_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "next_token", five_then_ctrl_c)
    assert cli.main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "50", "--seed", "1"]) == 130
    out, err = capsys.readouterr()
    assert out.startswith("def f") and len(out) == len("def f") + 5 + 1 and out.endswith("\n")  # 5 characters kept
    assert err.strip().splitlines()[-1] == "qkv: interrupted" and "decoded with" not in err


def test_an_absurd_max_new_tokens_is_capped_saying_why(run, monkeypatch, capsys):
    monkeypatch.setattr(importlib.import_module("qkv.cli.train"), "MAX_NEW_TOKENS", 7)
    assert cli.main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "100000000"]) == 0
    out, err = capsys.readouterr()
    assert len(out) == len("def f") + 7 + 1  # a character per token, and the newline
    assert "--max-new-tokens 100000000 capped at 7: past its max_len (64) the model sees only its last" in err


def test_sample_help_says_the_cap_and_that_ctrl_c_keeps_the_text(capsys):
    assert cli.main(["sample", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "at most 100,000" in text and "Ctrl-C stops and keeps it" in text


def child_env() -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}


def default_sigint():  # a shell's background job may ignore SIGINT, and a child would inherit that
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_sigint_to_a_real_qkv_sample_keeps_the_streamed_text(run):
    """The text comes while the process runs (streamed, flushed); SIGINT stops it: exit 130, the text kept."""
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "sample", "--run", str(run), "--prompt", "def f",
                             "--max-new-tokens", "100000", "--seed", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(), preexec_fn=default_sigint)
    got, give_up = b"", time.monotonic() + 120  # a guard against a hang, not a measurement
    while len(got) < 40 and time.monotonic() < give_up and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            got += os.read(proc.stdout.fileno(), 4096)
    still_running = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    out = got + out
    assert still_running and len(got) >= 40, (got, err[-2000:])  # printed before it was done
    assert proc.returncode == 130, err[-2000:]
    assert out.startswith(b"def f") and out.endswith(b"\n") and len(out) < 100000
    assert err.decode().strip().splitlines()[-1] == "qkv: interrupted"
