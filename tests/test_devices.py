"""Device decisions as plain functions, tested on a CPU with CUDA mocked: names, indices, torchrun ranks, bf16,
what runs where (the memory estimate, the loss read-back, the study's workers). A GPU run's state resumed on a
CPU: tests/test_train.py."""
import re

import pytest
import torch

from qkv import runtime
from qkv.cli import main
from qkv.runtime import auto_means, device_type, resolve_device
from qkv.training import recipe as recipe_module
from qkv.training.memory import activation_bytes, estimate_memory


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine with one bf16-less GPU, as far as the decisions can tell."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


def test_device_names(one_gpu):
    assert resolve_device("auto") == torch.device("cuda:0") and resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda", local_rank=0) == torch.device("cuda:0")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"--device cuda:7: this machine has 1 GPU\(s\), cuda:0 … cuda:0"):
        resolve_device("cuda:7")
    with pytest.raises(ValueError, match="would share one GPU; pass --device cuda"):
        resolve_device("cuda:0", local_rank=1, local_world=2)
    with pytest.raises(ValueError, match="device must be auto, cpu or cuda\\[:N\\], got 'gpu'"):
        resolve_device("gpu")
    assert device_type("auto") == "cuda" and device_type("cpu") == "cpu"
    with auto_means("cpu"):
        assert resolve_device("auto") == torch.device("cpu") and device_type("auto") == "cpu"
    assert device_type("auto") == "cuda"


def test_no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device cuda: CUDA is not available on this machine"):
        resolve_device("cuda")


@pytest.mark.parametrize("argv, message", [
    (["--device", "cuda:7"], r"--device cuda:7: this machine has 1 GPU\(s\)"),
    (["--device", "cuda", "--bf16"], "--bf16: Tesla T4 does not compute bfloat16; train with --no-bf16"),
])
def test_train_refuses_a_bad_device_in_one_line_writing_nothing(one_gpu, tmp_path, capsys, data, argv, message):
    out = tmp_path / "r"
    assert main(["train", "--preset", "tiny", "--max-steps", "1", "--data", str(data), "--out", str(out),
                 "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()


def test_train_refuses_cuda_without_a_gpu(monkeypatch, tmp_path, capsys, data):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r"
    assert main(["train", "--preset", "tiny", "--max-steps", "1", "--data", str(data), "--out", str(out),
                 "--quiet", "--device", "cuda"]) == 2
    assert "CUDA is not available on this machine" in capsys.readouterr().err and not out.exists()


def test_the_gpu_estimate_counts_bf16_and_no_attention_weights():
    from qkv.models import GPT, PRESETS

    c = PRESETS["gpt2"].replace(vocab_size=50304)
    model = GPT(c.replace(num_layers=1))  # the states of one block; the activations of 12
    on_gpu = estimate_memory(model, c, sharding="none", world=1, rows=128, T=1024, blocks=12, checkpointed=False,
                             bf16=True, device=torch.device("cuda:0"))
    on_cpu = estimate_memory(model, c, sharding="none", world=1, rows=128, T=1024, blocks=12, checkpointed=False)
    assert on_gpu.activations < 100 * 2**30 < on_cpu.activations  # issue 46: the GPT-2 run that fits was "265 GiB"
    assert on_gpu.activations == activation_bytes(c, 12, 128, 1024, checkpointed=False, bf16=True,
                                                  attention_weights=False)
    assert "bf16" in on_gpu.describe() and "fp32" in on_cpu.describe()


def test_the_loss_is_read_back_every_step_on_a_cpu_and_in_batches_on_a_gpu():
    from types import SimpleNamespace

    from qkv.training.loop import Loop

    r = Loop(recipe_module.TrainConfig(preset="tiny", max_steps=100, eval_interval=40), None, None, None, None)
    r.state, r.stop_at, r.max_steps = recipe_module.TrainState(), None, 100
    due = {}
    for kind in ("cpu", "cuda"):
        r.engine = SimpleNamespace(device=torch.device(kind))
        due[kind] = [s for s in range(1, 101) if setattr(r.state, "step", s) or r.due()]
    assert due["cpu"] == list(range(1, 101))
    assert due["cuda"] == [25, 40, 50, 75, 80, 100]


def test_a_study_on_a_gpu_starts_one_worker(one_gpu):
    from qkv.studies.context import study_workers

    assert study_workers(None, 16, "auto") == 1 and study_workers(2, 16, "cuda") == 2
    assert study_workers(None, 16, "cpu") == 16 and study_workers(None, 4, "cpu") == 4
