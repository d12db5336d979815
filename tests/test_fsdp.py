"""FSDP2 sharding and activation checkpointing (qkv.training.sharding): two gloo processes on CPU under torchrun
reach one process's losses and weights, hold half the parameters each, and resume exactly."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.cli import main
from qkv.models import GPT, ModelConfig
from qkv.training.memory import PeakMemory, activation_bytes, estimated_bytes
from qkv.training.sharding import checkpoint_blocks, model_blocks, resolve_sharding

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
ARGS = ["train", "--preset", "tiny", "--max-steps", "10", "--eval-interval", "1", "--batch-size", "4",
        "--context", "32", "--sample-tokens", "0", "--device", "cpu", "--seed", "3"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
# Under torchrun: each rank's share of a sharded tiny GPT, then a run stopped at step 4 (resumed by the test), then
# the bytes a recipe's modules and optimizer hold outside FSDP's shards, after setup and after an evaluation.
SCRIPT = """
import json, os, sys
import torch
from torch.distributed.tensor import DTensor
from qkv.models import GPT, ModelConfig
from qkv.training.distributed import Dist
from qkv.training.recipe import Recipe, TrainConfig, train
from qkv.training.sharding import local_parameter_bytes, shard_model


def outside_shards(recipe):
    modules = [v for o in (recipe.engine, recipe.task) for v in vars(o).values() if isinstance(v, torch.nn.Module)]
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    tensors += [t for s in recipe.engine.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    unique = {id(t): t for t in tensors if not isinstance(t, DTensor)}
    return sum(t.numel() * t.element_size() for t in unique.values())


torch.distributed.init_process_group("gloo")
model = GPT(ModelConfig(vocab_size=64, d_model=32, attention=dict(num_heads=2), num_layers=2, max_len=32))
whole = sum(p.numel() * p.element_size() for p in model.parameters())
shard_model(model, torch.device("cpu"), 2)
out = sys.argv[1]
with open(os.path.join(out, "bytes%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"local": local_parameter_bytes(model), "whole": whole}, f)
torch.distributed.barrier()
cfg = TrainConfig(preset="tiny", data=sys.argv[2], max_steps=10, eval_interval=1, batch_size=4, context=32,
                  device="cpu", seed=3, sharding="fsdp", progress=False, out=os.path.join(out, "resumed"))
train(cfg, stop_at=4)
recipe = Recipe(TrainConfig(**{**cfg.to_dict(), "out": None}), Dist.from_env("cpu"))
recipe.setup()
held = {"setup": outside_shards(recipe)}
recipe.loop.evaluate()
held |= {"evaluated": outside_shards(recipe), "val_loss": recipe.loop.records[-1]["val_loss"],
         "whole": sum(p.numel() * p.element_size() for p in recipe.engine.model.parameters())}
with open(os.path.join(out, "held%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(held, f)
"""


ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}


def launch(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process; torchrun with fsdp and activation checkpointing; one fsdp run stopped at step 4."""
    d = tmp_path_factory.mktemp("fsdp")
    (d / "data.txt").write_text(TEXT, encoding="utf-8")
    data = ["--data", str(d / "data.txt")]
    launch([sys.executable, "-m", "qkv", *ARGS, *data, "--quiet", "--out", "one"], d)
    two = launch([*TORCHRUN, "-m", "qkv", *ARGS, *data, "--sharding", "fsdp", "--activation-checkpointing",
                  "--out", "fsdp"], d)
    (d / "script.py").write_text(SCRIPT, encoding="utf-8")
    launch([*TORCHRUN, str(d / "script.py"), str(d), str(d / "data.txt")], d)
    for copy in ("to_one", "broken"):  # the run stopped at step 4, for the tests that resume it elsewhere
        shutil.copytree(d / "resumed", d / copy)
    return d, two.stderr


def metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k != "elapsed_s"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_losses(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 11))
    for x, y in zip(a, b):
        assert abs(x["train_loss"] - y["train_loss"]) <= 1e-5 and abs(x["val_loss"] - y["val_loss"]) <= 1e-5, (x, y)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=1e-5, msg=name)


def test_fsdp_with_checkpointing_matches_one_process_losses_and_weights(runs, capsys):
    d, stderr = runs
    assert_same_losses(metrics(d / "one"), metrics(d / "fsdp"))
    assert_same_weights(d / "one", d / "fsdp")
    assert json.loads((d / "fsdp" / "summary.json").read_text())["world_size"] == 2
    line = re.search(r"sharding fsdp: about [\d.]+ MiB per rank = ([\d.]+) MiB weights, gradients and AdamW", stderr)
    n = sum(t.numel() for t in load_file(d / "one" / "model.safetensors").values())
    assert line and abs(float(line[1]) - 16 * n / 2 / 2**20) < 0.1, stderr[-2000:]  # ties are stored once
    peak = re.search(r"measured peak over the first 3 step\(s\): ([\d.]+) MiB per rank \(the most of 2;", stderr)
    assert peak and float(peak[1]) > 0, stderr[-2000:]
    assert main(["info", "--run", str(d / "fsdp")]) == 0 and "GPT" in capsys.readouterr().out


def test_each_rank_holds_half_the_parameters(runs):
    d, _ = runs
    shares = [json.loads((d / f"bytes{r}.json").read_text()) for r in (0, 1)]
    whole = shares[0]["whole"]
    assert sum(s["local"] for s in shares) == whole
    for s in shares:
        assert abs(s["local"] / whole - 0.5) < 0.05, shares


def test_no_rank_holds_a_whole_copy(runs):
    """After setup and after an evaluation, what a rank's recipe holds outside FSDP's shards (buffers, AdamW's
    step counts) is a small fraction of the model; every rank scores the same validation loss."""
    d, _ = runs
    held = [json.loads((d / f"held{r}.json").read_text()) for r in (0, 1)]
    for h in held:
        assert h["setup"] <= h["whole"] // 100 and h["evaluated"] <= h["whole"] // 100, held
    assert held[0]["val_loss"] == held[1]["val_loss"], held


def test_fsdp_resume_continues_exactly(runs):
    d, _ = runs
    assert [m["step"] for m in metrics(d / "resumed")] == [1, 2, 3, 4]
    launch([*TORCHRUN, "-m", "qkv", "train", "--resume", "--out", "resumed", "--sharding", "fsdp", "--quiet",
            "--sample-tokens", "0"], d)
    assert metrics(d / "resumed") == metrics(d / "fsdp")  # bit for bit, checkpointing or not
    assert_same_weights(d / "fsdp", d / "resumed")
    assert_same_losses(metrics(d / "one"), metrics(d / "resumed"))


def test_a_one_process_run_resumes_under_fsdp(runs):
    """A run of one process stopped at step 4 (its optimizer state numbered) continues sharded over two."""
    from qkv.training.recipe import TrainConfig, train

    d, _ = runs
    cfg = TrainConfig(preset="tiny", data=str(d / "data.txt"), max_steps=10, eval_interval=1, batch_size=4,
                      context=32, device="cpu", seed=3, threads=1, progress=False, out=str(d / "moved"))
    train(cfg, stop_at=4)
    launch([*TORCHRUN, "-m", "qkv", "train", "--resume", "--out", "moved", "--sharding", "fsdp", "--quiet",
            "--sample-tokens", "0"], d)
    assert_same_losses(metrics(d / "one"), metrics(d / "moved"))
    assert_same_weights(d / "one", d / "moved")


def test_activation_checkpointing_gives_the_same_gradients():
    config = ModelConfig(vocab_size=40, d_model=32, attention=dict(num_heads=2), num_layers=3, max_len=16, dropout=0.2)
    ids = torch.randint(0, 40, (2, 16))

    def gradients(checkpointed: bool) -> dict:
        torch.manual_seed(0)
        model = GPT(config)
        keys = list(model.state_dict())
        if checkpointed:
            assert checkpoint_blocks(model) == 3 and list(model.state_dict()) == keys
        torch.manual_seed(1)  # the same dropout masks, replayed in the recomputation
        model(ids).logits.logsumexp(-1).mean().backward()
        return {n: p.grad for n, p in model.named_parameters()}

    plain, recomputed = gradients(False), gradients(True)
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(plain[name], recomputed[name], rtol=0, atol=1e-6, msg=name)
    assert len(model_blocks(GPT(config))) == 3 and not hasattr(GPT.forward, "__wrapped__")


def test_sharding_choices_and_memory_estimate():
    assert [resolve_sharding("auto", w) for w in (1, 2)] == ["none", "ddp"]
    for name, world, message in [("fsdp", 1, "needs|launch it with torchrun"), ("ddp", 1, "torchrun"),
                                 ("none", 2, "unsynchronised"), ("zero", 2, "one of auto, none, ddp, fsdp")]:
        with pytest.raises(ValueError, match=message):
            resolve_sharding(name, world)
    model = torch.nn.Linear(10, 10)  # 110 parameters
    model.bias.requires_grad_(False)
    assert estimated_bytes(model, "none", 1) == 100 * 16 + 10 * 4
    assert estimated_bytes(model, "fsdp", 2) == (100 * 16 + 10 * 4) // 2 == estimated_bytes(model, "ddp", 2) // 2


@pytest.mark.parametrize("flags, message", [
    (["--sharding", "zero"], "sharding must be one of auto, none, ddp, fsdp, got 'zero'"),
    (["--sharding", "fsdp"], "--sharding fsdp spreads training over processes: launch it with torchrun"),
])
def test_bad_sharding_is_one_line_and_exit_2(flags, message, tmp_path, capsys):
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    assert main([*ARGS, "--data", str(tmp_path / "data.txt"), "--quiet", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qkv: error:") and message in err[0], err
    assert not out.exists()


def test_fsdp_lora_matches_one_process(with_tokenizer, tmp_path):
    """LoRA adapters over a frozen Hugging Face base, sharded: the same losses and adapters as one process."""
    pytest.importorskip("peft", reason="the lora extra: pip install -e '.[lora]'")
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    lora = ["train", "--init-from-hf", str(with_tokenizer), "--lora", "4", "--data", str(tmp_path / "data.txt"),
            *ARGS[3:], "--quiet", "--lr", "3e-2"]
    launch([sys.executable, "-m", "qkv", *lora, "--out", "one"], tmp_path)
    launch([*TORCHRUN, "-m", "qkv", *lora, "--sharding", "fsdp", "--out", "fsdp"], tmp_path)
    assert_same_losses(metrics(tmp_path / "one"), metrics(tmp_path / "fsdp"))
    a, b = (load_file(tmp_path / d / "adapters.safetensors") for d in ("one", "fsdp"))
    assert a.keys() == b.keys() and a and not (tmp_path / "fsdp" / "model.safetensors").exists()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    script = ("import sys, torch; from qkv.training.recipe import TrainConfig, train; "
              "torch.distributed.init_process_group('gloo'); "
              f"train(TrainConfig(init_from_hf={str(with_tokenizer)!r}, lora=4, data='data.txt', max_steps=10, "
              "eval_interval=1, batch_size=4, context=32, lr=3e-2, device='cpu', seed=3, sharding='fsdp', "
              "progress=False, out='stopped'), stop_at=4)")
    (tmp_path / "stop.py").write_text(script, encoding="utf-8")
    launch([*TORCHRUN, "stop.py"], tmp_path)  # its distributed checkpoint holds the adapters alone
    launch([sys.executable, "-m", "qkv", "train", "--resume", "--out", "stopped", "--sharding", "none", "--quiet",
            "--sample-tokens", "0"], tmp_path)
    assert_same_losses(metrics(tmp_path / "one"), metrics(tmp_path / "stopped"))


def saved_step(run: Path) -> int:
    try:
        return torch.load(run / "train_state.pt", weights_only=True)["step"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return 0


def rank_pid(torchrun: int, rank: int) -> int:
    """The process id of ``rank`` among torchrun's workers (its children)."""
    children = Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split()
    for pid in children:
        if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return int(pid)
    raise AssertionError(f"no rank {rank} among torchrun's children {children}")


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_weights(runs):
    """SIGKILL rank 0 (the writer, holding the lock) once a checkpoint exists; --resume ends bit for bit where
    the uninterrupted run ended. The folder of the step after the checkpoint holds debris, as a kill would leave."""
    d, _ = runs
    run = d / "killed"
    job = subprocess.Popen([*TORCHRUN, "-m", "qkv", *ARGS, "--data", str(d / "data.txt"), "--sharding", "fsdp",
                            "--quiet", "--out", "killed"], cwd=d, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 150
    while saved_step(run) < 2 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(rank_pid(job.pid, 0), signal.SIGKILL)
    assert job.wait(timeout=100) != 0 and not (run / "summary.json").exists()
    step = saved_step(run)
    assert 2 <= step < 10, step
    debris = run / "train_state.dcp" / f"step-{step + 1:08d}"
    debris.mkdir(exist_ok=True)
    (debris / "__0_0.distcp").write_bytes(b"half")
    launch([*TORCHRUN, "-m", "qkv", "train", "--resume", "--out", "killed", "--quiet", "--sample-tokens", "0"], d)
    assert metrics(run) == metrics(d / "fsdp")
    a, b = load_file(run / "model.safetensors"), load_file(d / "fsdp" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [p.name for p in (run / "train_state.dcp").iterdir()] == ["step-00000010"]


def test_a_two_process_checkpoint_resumes_in_one_process(runs):
    """The distributed checkpoint of 2 fsdp processes, resharded into one process without torchrun."""
    d, _ = runs
    assert torch.load(d / "to_one" / "train_state.pt", weights_only=True)["sharded"] == "train_state.dcp/step-00000004"
    launch([sys.executable, "-m", "qkv", "train", "--resume", "--out", "to_one", "--sharding", "none", "--quiet",
            "--sample-tokens", "0"], d)
    assert_same_losses(metrics(d / "one"), metrics(d / "to_one"))
    assert_same_weights(d / "one", d / "to_one")


def test_an_incomplete_distributed_checkpoint_is_one_line(runs, capsys):
    d, _ = runs
    (d / "broken" / "train_state.dcp" / "step-00000004" / ".metadata").unlink()
    before = (d / "broken" / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", "--out", str(d / "broken"), "--sharding", "none", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step-00000004 is not a complete distributed checkpoint (no .metadata)" in err[0], err
    assert (d / "broken" / "metrics.jsonl").read_bytes() == before


def test_activation_estimate_and_measured_peak():
    c = ModelConfig(vocab_size=40, d_model=32, attention=dict(num_heads=2), feed_forward=dict(d_ff=64), num_layers=3,
                    max_len=16)
    per_block = 8 * 32 + 2 * 64 + 2 * 2 * 16  # floats per token: the block's tensors, the attention weights
    head = 2 * 40 + 32  # logits and log-softmax, the embeddings' output
    assert activation_bytes(c, 3, 4, 16, checkpointed=False) == 4 * 4 * 16 * (3 * per_block + head)
    assert activation_bytes(c, 3, 4, 16, checkpointed=True) == 4 * 4 * 16 * (3 * 32 + per_block + head)
    # bf16 autocast on a GPU: 2 B a float, no attention weights kept (fused SDPA), the log-softmax still fp32
    fused = 8 * 32 + 2 * 64
    assert activation_bytes(c, 3, 4, 16, checkpointed=False, bf16=True, attention_weights=False) == \
        4 * 16 * (2 * (3 * fused + 40 + 32) + 4 * 40)
    memory = PeakMemory(torch.device("cpu"))
    # 64 MiB, touched: past glibc's largest mmap threshold (32 MiB), so fresh pages, not resident free heap
    held = torch.ones(64 * 2**20 // 4)
    if memory.peak() is None:
        pytest.skip("this platform does not report the peak resident set")
    assert memory.peak() >= 64 * 2**20 and held.sum() > 0


def test_a_run_that_will_not_fit_is_refused_with_the_arithmetic(tmp_path, capsys, monkeypatch):
    import qkv.training.setup as setup  # the recipe's setup reads the free memory

    monkeypatch.setattr(setup, "available_bytes", lambda device, processes: 2**19)  # half a MiB free
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    assert main([*ARGS, "--data", str(tmp_path / "data.txt"), "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"the run will not fit: about [\d.]+ MiB per rank = [\d.]+ MiB weights, "
                                       r"gradients and AdamW state .* \+ [\d.]+ MiB activations .* but 0.5 MiB are "
                                       r"available \(MemAvailable", err[0]), err
    assert not out.exists()


def test_a_distributed_checkpoint_runs_no_code_from_its_index(tmp_path):
    """DCP pickles its index: one naming anything but DCP's metadata classes is refused, unexecuted."""
    import pickle
    import warnings

    from qkv.training.sharded_checkpoint import load_sharded, save_sharded

    model = GPT(ModelConfig(vocab_size=40, d_model=16, attention=dict(num_heads=2), num_layers=1, max_len=8))
    opt = torch.optim.AdamW(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        save_sharded(model, opt, tmp_path / "ck")
    load_sharded(model, opt, tmp_path / "ck")  # its own index loads

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(Payload()))
    refused = r"ck/.metadata is not a distributed checkpoint's index \(a DCP index may not name (posix|os)\.system\)"
    with pytest.raises(ValueError, match=refused):
        load_sharded(model, opt, tmp_path / "ck")
    assert not (tmp_path / "ran").exists()
