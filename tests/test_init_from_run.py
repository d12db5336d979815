"""`qkv train --init-from RUN`: lm, sft and dpo start from a finished qkv run (its final weights, shape, tokenizer
and chat template) exactly as --init-from-hf starts from that run's export; LoRA over a run rebuilds for sample
and export; bad bases are one line and write nothing."""
import contextlib
import json
import math
import shutil

import pytest
import torch
from test_cli_train import fails
from test_dpo import pairs
from test_sft import arithmetic, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")

from qkv.cli import main
from qkv.data import load_tokenizer
from qkv.training.distributed import Dist
from qkv.training.export import export_run
from qkv.training.finetune import weights_sha256
from qkv.training.recipe import Recipe, TrainConfig, train
from qkv.training.run_dir import load_run
from qkv.training.tasks.dpo import adapters_off

FAST = ["--batch-size", "4", "--eval-interval", "1", "--threads", "1", "--quiet", "--device", "cpu",
        "--sample-tokens", "0"]


def config(**kw) -> TrainConfig:
    return TrainConfig(**({"max_steps": 1, "batch_size": 4, "eval_interval": 1, "threads": 1, "progress": False,
                           "final_eval": False, "seed": 3, "device": "cpu", "lr": 1e-2} | kw))


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("chats") / "chat.jsonl", arithmetic(60))


@pytest.fixture(scope="module")
def sft_base(chats, tmp_path_factory):
    """A finished sft run from scratch (ChatML saved with it) and its Hugging Face export."""
    d = tmp_path_factory.mktemp("sft_base")
    train(config(task="sft", preset="tiny", data=chats, vocab_size=300, max_steps=3, out=str(d / "run")))
    return d / "run", export_run(d / "run", d / "hf")


def losses(out) -> list[tuple]:
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in map(json.loads, open(out / "metrics.jsonl"))]


def test_sft_from_a_run_is_sft_from_its_export(sft_base, chats, tmp_path):
    run, hf = sft_base
    a, b = tmp_path / "from_run", tmp_path / "from_hf"
    train(config(task="sft", data=chats, max_steps=3, init_from=str(run), out=str(a)))
    train(config(task="sft", data=chats, max_steps=3, init_from_hf=str(hf), out=str(b)))
    steps_a, steps_b = losses(a), losses(b)
    assert [s for s, _, _ in steps_a] == [s for s, _, _ in steps_b] == [1, 2, 3]
    for (_, *x), (_, *y) in zip(steps_a, steps_b):
        assert x == pytest.approx(y, abs=1e-5, nan_ok=True), (steps_a, steps_b)
    assert (a / "chat_template.jinja").read_text() == (b / "chat_template.jinja").read_text() \
        == (run / "chat_template.jinja").read_text()  # the run's template, kept
    assert load_tokenizer(a).to_json() == load_tokenizer(run).to_json()
    assert load_tokenizer(a).encode("<|im_start|>user 1+2?") == load_tokenizer(b).encode("<|im_start|>user 1+2?")
    saved = json.loads((a / "train_config.json").read_text())
    assert saved["init_from"] == str(run) and saved["init_sha256"] == weights_sha256(run)
    assert saved["preset"] is None


@pytest.fixture(scope="module")
def lm_base(data, tmp_path_factory):
    """A finished lm run of the tiny preset (a character tokenizer)."""
    base = tmp_path_factory.mktemp("lm_base") / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--max-steps", "3", "--out", str(base), *FAST]) == 0
    return base


def test_lm_from_a_run_continues_from_its_weights(lm_base, data, tmp_path):
    tuned = tmp_path / "tuned"
    assert main(["train", "--init-from", str(lm_base), "--data", str(data), "--max-steps", "0", "--out", str(tuned),
                 *FAST]) == 0
    s0, s1 = (json.loads((d / "summary.json").read_text()) for d in (lm_base, tuned))
    assert s1["val_loss"] == pytest.approx(s0["val_loss"], abs=1e-6)  # not a fresh model's ln V
    assert s1["tokenizer"] == s0["tokenizer"] == "char" and s1["steps"] == 0
    assert json.loads((tuned / "train_config.json").read_text())["init_sha256"] == weights_sha256(lm_base)


def test_resume_needs_the_same_run_weights(lm_base, data, tmp_path, capsys):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    shutil.copytree(lm_base, base)
    args = ["train", "--init-from", str(base), "--data", str(data), "--out", str(tuned), *FAST]
    assert main([*args, "--max-steps", "1"]) == 0
    assert main(["train", "--resume", "--out", str(tuned), "--max-steps", "2", *FAST]) == 0
    assert main(["train", "--resume", "--out", str(base), "--max-steps", "4", *FAST]) == 0  # the base trains on
    fails(capsys, ["train", "--resume", "--out", str(tuned), "--max-steps", "3", *FAST],
          r"is not the base this run was trained from: its weights' SHA-256")


def test_a_character_run_is_no_sft_base(lm_base, chats, tmp_path, capsys):
    fails(capsys, ["train", "--task", "sft", "--init-from", str(lm_base), "--data", chats, "--out",
                   str(tmp_path / "out"), *FAST], r"byte-level BPE .*; the run .* has a char tokenizer")
    assert not (tmp_path / "out").exists()


def test_lora_over_a_run_samples_and_exports(sft_base, chats, tmp_path, capsys):
    pytest.importorskip("peft", reason="the lora extra: pip install -e '.[lora]'")
    transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
    run, out = sft_base[0], tmp_path / "lora"
    assert main(["train", "--task", "sft", "--init-from", str(run), "--lora", "2", "--data", chats, "--max-steps", "2",
                 "--lr", "3e-2", "--out", str(out), *FAST]) == 0
    assert (out / "adapters.safetensors").exists() and not (out / "model.safetensors").exists()
    tuned = load_run(out).model
    assert any(not torch.equal(p, load_run(run).model.state_dict()[k]) for k, p in tuned.state_dict().items())
    capsys.readouterr()
    assert main(["sample", "--run", str(out), "--chat", "--prompt", "1+2?", "--temperature", "0",
                 "--max-new-tokens", "4", "--device", "cpu"]) == 0
    hf = export_run(out, tmp_path / "hf")
    ids = torch.tensor([[1, 2, 3, 4]])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()(ids).logits
    torch.testing.assert_close(theirs, tuned(ids).logits, atol=1e-4, rtol=1e-4)
    capsys.readouterr()
    assert main(["info", "--run", str(out)]) == 0
    assert f"base:          {run} (weights SHA-256 {weights_sha256(run)[:16]}" in capsys.readouterr().out
    shutil.move(run, tmp_path / "moved")  # the base gone: the adapters cannot be applied, in one line
    try:
        fails(capsys, ["sample", "--run", str(out), "--prompt", "1", "--device", "cpu"], r"no such directory")
    finally:
        shutil.move(tmp_path / "moved", run)


@pytest.mark.parametrize("lora", [None, 2])
def test_dpo_from_a_run_takes_the_run_as_its_reference(sft_base, tmp_path, lora):
    if lora:
        pytest.importorskip("peft", reason="the lora extra: pip install -e '.[lora]'")
    run, data = sft_base[0], write_jsonl(tmp_path / "p.jsonl", pairs(16))
    r = Recipe(config(task="dpo", data=data, max_steps=0, init_from=str(run), lora=lora), Dist())
    r.setup()
    base = load_run(run).model
    reference = r.task.reference if lora is None else r.engine.model  # with LoRA: the adapters switched off
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad(), (adapters_off(reference) if lora else contextlib.nullcontext()):
        torch.testing.assert_close(reference.eval()(ids).logits, base(ids).logits)
    s = train(config(task="dpo", data=data, max_steps=0, init_from=str(run), lora=lora, final_eval=True)).summary
    assert s["val_loss"] == pytest.approx(math.log(2), abs=1e-5)


def unfinished(run, tmp_path):
    d = tmp_path / "unfinished"
    shutil.copytree(run, d)
    (d / "summary.json").unlink()
    return d


def without_weights(run, tmp_path):
    d = tmp_path / "no_weights"
    shutil.copytree(run, d)
    (d / "model.safetensors").unlink()
    return d


@pytest.mark.parametrize("make, flags, message", [
    (lambda run, tmp: tmp / "missing", [], r"the base run \(--init-from\) .*missing is not a qkv run: no such directory"),
    (without_weights, [], r"is not a qkv run: missing model.safetensors"),
    (unfinished, [], r"the run has not finished \(no summary.json"),
    (None, ["--init-from-hf", "HF"], r"--init-from \(a qkv run\) and --init-from-hf .* both name the base"),
    (None, ["--preset", "tiny"], r"--init-from takes the model's shape from the run; drop --preset tiny"),
    (None, ["--d-model", "64"], r"--init-from takes the model's shape from the run; drop the shape flags"),
    (None, ["--out", "BASE"], r"--init-from .* is also --out: the run would overwrite its own base"),
    (None, ["--tokenizer", "char"], r"--init-from keeps the checkpoint's own tokenizer"),
    (lambda run, tmp: run.parent / "hf", [], r"--init-from .* is a Hugging Face model directory, not a qkv run "
                                             r"directory: give it as --init-from-hf"),
])
def test_bad_bases_are_one_line_and_write_nothing(sft_base, chats, tmp_path, capsys, make, flags, message):
    run = sft_base[0]
    base = make(run, tmp_path) if make else run
    flags = [{"HF": str(sft_base[1]), "BASE": str(run)}.get(f, f) for f in flags]
    out = tmp_path / "out"
    before = sorted(p.name for p in run.iterdir())
    argv = ["train", "--task", "sft", "--init-from", str(base), "--data", chats, "--max-steps", "1", *FAST, *flags]
    fails(capsys, argv + ([] if "--out" in flags else ["--out", str(out)]), message)
    assert not out.exists() and sorted(p.name for p in run.iterdir()) == before


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    from test_cli_translate import ARGS, WORDS, ZH

    d = tmp_path_factory.mktemp("translate")
    (d / "pairs.tsv").write_text("".join(f"{a}\t{za}\n" for a, za in zip(WORDS, ZH)) * 4, encoding="utf-8")
    assert main(["train", *ARGS, "--max-steps", "1", "--pairs", str(d / "pairs.tsv"), "--out", str(d / "run")]) == 0
    return d / "run"


def test_a_translate_run_is_no_decoder_base(translate_run, chats, tmp_path, capsys):
    fails(capsys, ["train", "--task", "sft", "--init-from", str(translate_run), "--data", chats, "--out",
                   str(tmp_path / "out"), *FAST], r"holds a qkv\.\w*Transformer, not a decoder")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="fine-tunes a decoder"):
        config(task="translate", init_from=str(translate_run))
