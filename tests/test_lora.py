"""`qkv train --init-from-hf DIR --lora R`: adapters over a frozen base, stored alone (adapters.safetensors),
applied by sample, merged by export; resumed bit for bit, only against the same base."""
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from test_cli_train import fails

pytestmark = pytest.mark.usefixtures("one_thread")
from test_export import hf_load
from test_finetune import FAST, llama, text  # noqa: F401  (fixtures)

from qkv.training.run_dir import load_run
from qkv.cli import main
from qkv.training.finetune import add_lora, merge_lora
from qkv.interop.hf import load_pretrained
from torch.nn import Linear
from qkv.training.recipe import TrainConfig, train

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
pytest.importorskip("peft", reason="the lora extra: pip install -e '.[lora]'")


def lora_train(base, text, out, *flags):
    assert main(["train", "--init-from-hf", str(base), "--data", str(text), *FAST, "--lr", "3e-2",
                 "--out", str(out), *flags]) == 0
    return out


def adapters(run):
    with safe_open(str(run / "adapters.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def lora_run(with_tokenizer, text, tmp_path_factory):
    return lora_train(with_tokenizer, text, tmp_path_factory.mktemp("lora") / "r", "--lora", "4", "--max-steps", "4")


def test_only_adapters_train_and_are_stored(lora_run, with_tokenizer):
    names = sorted(adapters(lora_run))
    assert not (lora_run / "model.safetensors").exists()
    assert names == sorted(f"blocks.0.attn.{p}.lora_{m}.weight" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                           for m in "AB")
    summary = json.loads((lora_run / "summary.json").read_text())
    assert summary["trainable_parameters"] == 4 * (4 * 16 + 16 * 4)  # A (r × C) + B (C × r) per projection
    base = load_pretrained(with_tokenizer)[0].state_dict()
    tuned = load_run(lora_run).model.state_dict()
    changed = sorted(k for k in base if not torch.equal(base[k], tuned[k]))
    assert changed and all(".attn." in k and k.endswith("_proj.weight") for k in changed), changed  # the rest frozen
    saved = json.loads((lora_run / "train_config.json").read_text())
    assert (saved["lora"], saved["lora_alpha"], saved["lora_targets"]) == (4, 8.0, "attn")


def test_sample_applies_the_adapters_and_export_merges_them(lora_run, with_tokenizer, tmp_path, capsys):
    model = add_lora(load_pretrained(with_tokenizer)[0], r=4, alpha=8.0)
    model.load_state_dict({k.replace(".weight", ".default.weight") if ".lora_" in k else k: v
                           for k, v in adapters(lora_run).items()}, strict=False)
    ids = torch.tensor([load_run(lora_run).tokenizer.encode("the dog bites the man")])
    with torch.no_grad():
        unmerged = model(ids).logits[0]
        merged = load_run(lora_run).model(ids).logits[0]
    torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=0)
    assert type(merge_lora(model).blocks[0].attn.q_proj) is Linear  # the LoRA wrapper is gone
    argv = ["sample", "--run", str(lora_run), "--prompt", "the dog", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(argv) == 0
    greedy = load_run(lora_run).model.generate(torch.tensor([model_ids := ids[0, :2].tolist()]), 6, temperature=0)
    assert capsys.readouterr().out.rstrip("\n") == load_run(lora_run).tokenizer.decode(greedy[0].tolist())
    assert model_ids == load_run(lora_run).tokenizer.encode("the dog")
    assert main(["export", "--run", str(lora_run), "--hf", str(tmp_path / "hf")]) == 0
    got = hf_load(tmp_path / "hf", "the dog bites the man")
    torch.testing.assert_close(torch.tensor(got["logits"]), merged, atol=1e-4, rtol=0)


def test_resume_is_bit_for_bit_and_only_against_the_same_base(lora_run, with_tokenizer, llama, text, tmp_path,
                                                                capsys):
    half = tmp_path / "half"  # interrupted at step 2 of 4, as Ctrl-C would
    train(TrainConfig(init_from_hf=str(with_tokenizer), data=str(text), lora=4, max_steps=4, context=16, batch_size=4,
                      eval_interval=2, lr=3e-2, device="cpu", out=str(half), progress=False), stop_at=2)
    fails(capsys, ["train", "--resume", "--out", str(half), "--init-from-hf", str(llama), "--max-steps", "4"],
          "not the base this run was trained from")
    fails(capsys, ["train", "--resume", "--out", str(half), "--lora", "8", "--max-steps", "4"],
          r"changed config \(lora: 4 -> 8\)")
    assert main(["train", "--resume", "--out", str(half), "--max-steps", "4", "--quiet", "--sample-tokens", "0"]) == 0
    whole, resumed = adapters(lora_run), adapters(half)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    base = tmp_path / "base"
    shutil.copytree(with_tokenizer, base)
    moved = lora_train(base, text, tmp_path / "moved", "--lora", "2", "--max-steps", "1")
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # the base changed under the run
    fails(capsys, ["sample", "--run", str(moved), "--prompt", "the"], "not the base this run was trained from")


def test_llama_adapters_on_the_feed_forward_export_to_llama(llama, text, tmp_path, capsys):
    run = lora_train(llama, text, tmp_path / "r", "--lora", "2", "--lora-alpha", "4", "--lora-targets",
                     "gate_proj,ff.down_proj,q_proj", "--max-steps", "2")
    assert {k.split(".")[-3] for k in adapters(run)} == {"gate_proj", "down_proj", "q_proj"}
    assert main(["export", "--run", str(run), "--hf", str(tmp_path / "hf")]) == 0
    got = hf_load(tmp_path / "hf", "attention is all")
    tuned = load_run(run)
    with torch.no_grad():
        expected = tuned.model(torch.tensor([tuned.tokenizer.encode("attention is all")])).logits[0]
    assert got["class"] == "LlamaForCausalLM"
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("flags, message", [
    (["--lora", "4", "--lora-targets", "q_proj,nope"], r"--lora-targets nope: no linear layer of the model's "
                                                       r"blocks has that name; choose among attn.k_proj, .*ff.up_proj"),
    (["--lora", "4", "--lora-targets", "lm_head"], r"lm_head: no linear layer"),
    (["--lora", "0"], r"must be a positive int"),
    (["--lora-alpha", "3"], r"give --lora R too"),
    (["--lora", "2", "--lora-alpha", "-1"], r"lora_alpha must be > 0"),
])
def test_bad_lora_flags_are_one_line_and_write_nothing(with_tokenizer, text, tmp_path, capsys, flags, message):
    out = tmp_path / "r"
    fails(capsys, ["train", "--init-from-hf", str(with_tokenizer), "--data", str(text), "--quiet",
                   "--max-steps", "1", "--out", str(out), *flags], message)
    assert not out.exists()


def test_lora_needs_a_checkpoint(data, tmp_path, capsys):
    fails(capsys, ["train", "--preset", "tiny", "--data", str(data), "--lora", "4", "--max-steps", "1",
                   "--out", str(tmp_path / "r")], r"--lora adapts a checkpoint: give --init-from-hf DIR")
    assert not (tmp_path / "r").exists()


def test_damaged_adapters_or_a_missing_base_are_one_line(lora_run, with_tokenizer, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(lora_run, run)
    f = run / "adapters.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0x40  # one bit of one adapter weight
    f.write_bytes(bytes(raw))
    fails(capsys, ["sample", "--run", str(run), "--prompt", "the"], "adapters do not match the checksum")
    f.write_bytes(bytes(raw[: len(raw) // 2]))
    fails(capsys, ["info", "--run", str(run)], "corrupt or truncated")
    shutil.copyfile(lora_run / "adapters.safetensors", f)
    saved = json.loads((run / "train_config.json").read_text())
    (run / "train_config.json").write_text(json.dumps(saved | {"init_from_hf": str(tmp_path / "gone")}))
    fails(capsys, ["export", "--run", str(run), "--hf", str(tmp_path / "hf")], "the base .*gone: no such directory")
    assert not (tmp_path / "hf").exists()


def test_merged_model_takes_new_adapters_without_peft_warnings():
    """A merged model (a LoRA run as the base of another) keeps no peft record: new adapters come without peft's
    "Already found a `peft_config`" warning."""
    import warnings

    from qkv.models import GPT, PRESETS

    model = add_lora(GPT(PRESETS["tiny"]), r=2, alpha=4)
    merge_lora(model)
    assert not hasattr(model, "peft_config")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        add_lora(model, r=2, alpha=4)
    assert len(model.peft_config) == 1
