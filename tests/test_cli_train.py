"""`qkv train / sample / info`, called in-process through qkv.cli.main."""
import importlib
import json
import re

import pytest
import torch

from qkv.cli import main
from qkv.data import load_corpus

FAST = ["--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-interval", "2", "--quiet",
        "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "r"
    assert main(["train", *FAST, "--data", str(data), "--max-steps", "4", "--out", str(out),
                 "--sample-tokens", "0"]) == 0
    return out


def snapshot(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


def fails(capsys, argv, message):
    """Exit 2 and one line on stderr naming the problem, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qkv: error:") and re.search(message, err[0]), err
    return err[0]


def test_train_prints_bpc_beside_compressors_and_a_sample(data, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--data", str(data), "--max-steps", "4", "--out", str(out),
                 "--sample-tokens", "20"]) == 0
    text = capsys.readouterr().out
    m = re.search(r"validation bits per character: model ([\d.]+) \| gzip -9 ([\d.]+) \| xz -9e ([\d.]+)", text)
    assert m, text
    summary = json.loads((out / "summary.json").read_text())
    assert float(m[1]) == pytest.approx(summary["val_bpc"], abs=1e-3)
    assert float(m[2]) == pytest.approx(summary["gzip_bpc"], abs=1e-3)
    prompt = summary["sample_prompt"]
    assert prompt and load_corpus(str(data)).val.lstrip().startswith(prompt)  # the data's own start
    assert f"sample (prompt {prompt!r}: the validation text's first characters; temperature 0.8" in text
    assert f"seed 1337):\n{prompt}" in text and text.endswith("\n")
    assert (out / "loss.png").is_file() and (out / "metrics.jsonl").read_text().count("\n") == 2


def test_no_speed_layer_trains_the_reference_modules_and_says_so(data, tmp_path):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--data", str(data), "--max-steps", "2", "--out", str(out), "--sample-tokens", "0",
                 "--no-speed-layer"]) == 0
    assert json.loads((out / "summary.json").read_text())["speed_layer"] is False


def test_the_sample_after_training_starts_from_the_users_text(tmp_path, capsys):
    """Trained on Chinese, the closing sample starts from Chinese characters of the data, not from `def `."""
    text = "".join(f"第{i}天，狗咬人，人咬狗。今天天气很好，我们去公园散步。\n" for i in range(400))
    (tmp_path / "zh.txt").write_text(text, encoding="utf-8")
    assert main(["train", *FAST, "--data", str(tmp_path / "zh.txt"), "--max-steps", "2", "--out",
                 str(tmp_path / "r"), "--sample-tokens", "5"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("sample (prompt "))
    prompt = json.loads((tmp_path / "r" / "summary.json").read_text(encoding="utf-8"))["sample_prompt"]
    assert "def" not in line and prompt in text and "狗咬人" in prompt and repr(prompt) in line
    assert out.split(line + "\n", 1)[1].startswith(prompt)


def test_sample_and_info(run, capsys):
    assert main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "15", "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("def f") and len(first.rstrip("\n")) >= 5
    assert main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "15", "--seed", "1",
                 "--top-k", "5", "--top-p", "0.9", "--temperature", "0.7"]) == 0
    assert main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "15", "--seed", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-len(first.splitlines()):] == first.splitlines()  # reproducible
    assert main(["info", "--run", str(run)]) == 0
    info = capsys.readouterr().out
    assert "tokenizer:" in info and "char" in info and "val_bpc:" in info and "gzip -9" in info


def test_sample_decodes_with_bf16_weights_when_asked(run, capsys, monkeypatch):
    gen, seen = importlib.import_module("qkv.generation.decode"), []
    real = gen.generate
    monkeypatch.setattr(gen, "generate", lambda model, *a, **k: seen.append(model.lm_head.weight.dtype) or
                        real(model, *a, **k))
    for dtype in ("float32", "bfloat16"):
        assert main(["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "8", "--temperature", "0",
                     "--dtype", dtype]) == 0
        assert capsys.readouterr().out.startswith("def f")
    assert seen == [torch.float32, torch.bfloat16]


def test_sample_on_a_gpu_decodes_with_the_cuda_graph_and_a_cpu_falls_back_saying_why(run, capsys, monkeypatch):
    """The backend is the library's choice (qkv.generation.backends.backend_for): cudagraph by default for a model on
    a GPU (mocked here: the decisions see one, the weights and the graph-free step stay on the CPU)."""
    from qkv.generation import cuda_graph, paths

    argv = ["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "6", "--temperature", "0",
            "--device", "cpu"]
    assert main([*argv, "--backend", "cudagraph"]) == 0
    cpu = capsys.readouterr()
    assert cpu.err.strip().splitlines()[-1] == (
        "qkv: the CUDA-graph step cannot decode this model: the model is on the CPU; CUDA graphs need a CUDA "
        "device; decoded with the auto backend (the model's forward; on a CPU its linears through qkv's kernels)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(paths, "model_device", lambda model: torch.device("cuda:0"))
    monkeypatch.setattr(cuda_graph, "GraphStep", lambda step, model=None: cuda_graph.StaticStep(step))
    assert main(argv) == 0
    gpu = capsys.readouterr()
    assert gpu.out == cpu.out and gpu.err.strip().splitlines()[-1] == (
        "qkv: decoded with the cudagraph backend (the one-token step replayed as a CUDA graph)")


def test_held_out_bpc_is_the_runs_final_score_and_bf16_weights_change_it_little(run):
    from qkv.training.run_dir import load_run
    from qkv.data import load_corpus
    from qkv.training.tasks.language_model import held_out_bpc

    r, cfg = load_run(run), json.loads((run / "train_config.json").read_text())
    text = load_corpus(cfg["data"]).val
    fp32 = held_out_bpc(r.model, r.tokenizer, text, cfg["context"])
    assert fp32 == pytest.approx(json.loads((run / "summary.json").read_text())["val_bpc"], rel=1e-5)
    bf16 = held_out_bpc(r.model.bfloat16(), r.tokenizer, text, cfg["context"])
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, rel=0.02)


def test_resume_continues_a_run(data, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--data", str(data), "--max-steps", "2", "--out", str(out), "--sample-tokens", "0"]) == 0
    assert main(["train", "--resume", "--out", str(out), "--max-steps", "4", "--quiet", "--sample-tokens", "0"]) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4] and json.loads((out / "summary.json").read_text())["steps"] == 4


def test_default_out_never_overwrites(data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["train", *FAST, "--data", str(data), "--max-steps", "2", "--sample-tokens", "0"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny", "tiny-2"]


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), (b"", "is empty"), (b"\x7fELF\x00\x00\x01", "binary"),
])
def test_bad_data_overwrites_nothing(run, tmp_path, capsys, content, message):
    f = tmp_path / "data.txt"
    if content is not None:
        f.write_bytes(content)
    before = snapshot(run)
    fails(capsys, ["train", *FAST, "--data", str(f), "--max-steps", "2", "--out", str(run), "--overwrite"], message)
    assert snapshot(run) == before


def test_bad_inputs(run, data, tmp_path, capsys):
    before = snapshot(run)
    fails(capsys, ["train", "--preset", "huge", "--out", str(tmp_path / "x")], "unknown preset 'huge'")
    fails(capsys, ["train", *FAST, "--data", str(data), "--out", str(run), "--max-steps", "2"],
          "already exists; pass --resume")
    fails(capsys, ["train", "--resume", "--out", str(run), "--lr", "0.5"], r"changed config \(lr: 0.006 -> 0.5\)")
    fails(capsys, ["train", "--resume", "--out", str(tmp_path / "none")], "not a qkv run")
    fails(capsys, ["train", "--resume", "--out", str(run)], "already finished")
    fails(capsys, ["train", "--max-steps", "-3", "--out", str(tmp_path / "y")], "max_steps must be an int >= 0")
    fails(capsys, ["train", "--optimizer", "adamw", "--muon-lr", "0.02", "--out", str(tmp_path / "y")], "needs optimizer 'muon', got 'adamw'")
    fails(capsys, ["train", "--optimizer", "sgd", "--out", str(tmp_path / "y")], r"invalid choice: 'sgd'")
    fails(capsys, ["train", "--resume", "--out", str(run), "--schedule", "wsd"], r"changed config \(schedule: ")
    fails(capsys, ["sample", "--run", str(run), "--prompt", "déf ✓"], r"outside .*'é', '✓'")
    fails(capsys, ["sample", "--run", str(tmp_path), "--prompt", "def"], "not a qkv run")
    fails(capsys, ["info", "--run", str(tmp_path / "nope")], "not a qkv run")
    fails(capsys, ["sample", "--run", str(run), "--prompt", "def", "--top-p", "2"], "top_p")
    assert snapshot(run) == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_corrupt_checkpoint(run, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name, content in snapshot(run).items():
        (broken / name).write_bytes(content[: len(content) // 2] if name == "model.safetensors" else content)
    fails(capsys, ["sample", "--run", str(broken), "--prompt", "def"], "corrupt or truncated")
    fails(capsys, ["train", "--resume", "--out", str(broken), "--max-steps", "8", "--quiet"], "corrupt or truncated")


def test_sample_says_which_backend_ran_and_why_it_fell_back(run, capsys, monkeypatch):
    """--backend chooses what computes the tokens (the same greedy text from each); stderr names the one that
    ran (auto: the fused step where it accepts the model), and a fused step that cannot run the model says why
    before naming auto."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    argv = ["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "8", "--temperature", "0"]
    texts = {}
    for backend in ("auto", "eager", "inductor"):
        assert main([*argv, "--backend", backend]) == 0
        out, err = capsys.readouterr()
        texts[backend] = out
        ran = {"auto": ("auto", "fused")}.get(backend, (backend,))
        assert any(err.strip().splitlines()[-1].startswith(f"qkv: decoded with the {b} backend (") for b in ran), err
    assert len(set(texts.values())) == 1
    fused = importlib.import_module("qkv.kernels.fused_step")
    monkeypatch.setattr(fused, "refuses", lambda model, batch: "a reason the test gives")
    assert main([*argv, "--backend", "fused"]) == 0
    out, err = capsys.readouterr()
    assert out == texts["auto"]
    assert err.strip().splitlines()[-1] == ("qkv: the fused step cannot decode this model at batch 1: a reason the "
                                            "test gives; decoded with the auto backend (the model's forward; on a "
                                            "CPU its linears through qkv's kernels)")


def test_a_token_count_reads_in_words():
    from qkv.cli.train import token_count

    assert token_count(1632) == "1,632 tokens" and token_count(2_345_678) == "2.35 M tokens"


def test_every_train_config_setting_is_one_flag_made_from_its_field(tmp_path):
    from dataclasses import fields

    from qkv.cli import CommandError, build_parser
    from qkv.cli.train import GROUPS, train_config, train_flags
    from qkv.training.config import TrainConfig

    flags = train_flags()
    assert {f.name for f in flags.values()} == {f.name for f in fields(TrainConfig) if "help" in f.metadata}
    assert all(f.help and f.group in GROUPS for f in flags.values())
    assert (flags["--pairs"].name, flags["--max-minutes"].kind, flags["--lora"].kind) == ("data", float, int)
    assert flags["--bf16"].negatable and flags["--speed-layer"].negatable and not flags["--fused-adamw"].negatable
    args = build_parser().parse_args(["train", "--max-steps", "1", "--no-speed-layer", "--lr", "0.01",
                                      "--out", str(tmp_path / "r")])
    cfg = train_config(args)
    assert (cfg.max_steps, cfg.speed_layer, cfg.lr, cfg.fused_adamw) == (1, False, 0.01, False)
    args = build_parser().parse_args(["train", "--data", "a", "--pairs", "b", "--max-steps", "1"])
    with pytest.raises(CommandError, match="--pairs and another flag for data disagree"):
        train_config(args)
