"""`qkv train --init-from-hf DIR`: fine-tune a Hugging Face GPT-2 or LLaMA directory into an ordinary run
that sample, info, explore, verify and export accept; --resume refuses a different base."""
import json
import re
import shutil

import pytest
import torch
from test_cli_train import fails

pytestmark = pytest.mark.usefixtures("one_thread")

from qkv.training.run_dir import load_run
from qkv.cli import main
from qkv.data import load_tokenizer
from qkv.training.finetune import weights_sha256
from qkv.interop.hf import load_pretrained

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

SENTENCES = ["the dog bites the man", "the man bites the dog", "attention is all you need", "héllo wörld"]
FAST = ["--context", "16", "--batch-size", "4", "--eval-interval", "2", "--quiet", "--device", "cpu",
        "--sample-tokens", "0"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    f = tmp_path_factory.mktemp("text") / "sentences.txt"
    f.write_text("".join(f"{s} {i}\n" for i in range(60) for s in SENTENCES), encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def llama(with_tokenizer, tmp_path_factory):
    """A tiny random LLaMA (grouped K/V heads, untied head) with the GPT-2-style tokenizer of with_tokenizer."""
    d = tmp_path_factory.mktemp("llama")
    tok = transformers.AutoTokenizer.from_pretrained(with_tokenizer)
    tok.save_pretrained(d)
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).save_pretrained(d)
    return d


def base_weights(path):
    return {k: v.clone() for k, v in load_pretrained(path)[0].state_dict().items()}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_run_starts_from_the_checkpoint_with_its_tokenizer(family, with_tokenizer, llama, text, tmp_path):
    base = with_tokenizer if family == "gpt2" else llama
    out = tmp_path / "r"
    assert main(["train", "--init-from-hf", str(base), "--data", str(text), *FAST, "--max-steps", "1",
                 "--lr", "1e-12", "--out", str(out)]) == 0  # one step of a vanishing lr: still the base
    run, (model, tok) = load_run(out), load_pretrained(base)
    assert run.config == model.config
    for k, v in model.state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[k], v, atol=1e-6, rtol=0)
    assert load_tokenizer(out).encode("the dog bites") == tok.encode("the dog bites")
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["init_from_hf"] == str(base) and saved["init_sha256"] == weights_sha256(base)


@pytest.fixture(scope="module")
def tuned(with_tokenizer, text, tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned") / "r"
    assert main(["train", "--init-from-hf", str(with_tokenizer), "--data", str(text), *FAST, "--max-steps", "4",
                 "--lr", "1e-2", "--out", str(out)]) == 0
    return out


def test_the_run_is_an_ordinary_run(tuned, with_tokenizer, tmp_path, capsys):
    before = base_weights(with_tokenizer)
    after = load_run(tuned).model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    assert main(["sample", "--run", str(tuned), "--prompt", "the dog", "--max-new-tokens", "5", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("the dog")
    assert main(["info", "--run", str(tuned)]) == 0
    info = capsys.readouterr().out
    assert "val_bpc:" in info and re.search(r"tokenizer: +bpe, \d+ tokens", info)
    assert main(["explore", "--run", str(tuned), "--text", "the man bites", "--out", str(tmp_path / "p.html")]) == 0
    assert (tmp_path / "p.html").stat().st_size > 1000
    assert main(["verify", "--run", str(tuned), "--only", "head-diversity", "--text", "the dog bites the man"]) in (0, 1)
    assert main(["export", "--run", str(tuned), "--hf", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.model_type == "gpt2"


def test_resume_needs_the_same_base(tuned, with_tokenizer, llama, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(tuned, run)
    fails(capsys, ["train", "--resume", "--out", str(run), "--init-from-hf", str(llama), "--max-steps", "6"],
          r"is not the base this run was trained from")
    moved = tmp_path / "moved"
    shutil.copytree(with_tokenizer, moved)  # the same weights elsewhere: accepted
    assert main(["train", "--resume", "--out", str(run), "--init-from-hf", str(moved), "--max-steps", "6",
                 "--quiet", "--sample-tokens", "0"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    assert json.loads((run / "train_config.json").read_text())["init_from_hf"] == str(moved)
    weights = moved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # the base changed under the run
    fails(capsys, ["train", "--resume", "--out", str(run), "--max-steps", "8"], r"not the base")


@pytest.fixture(scope="module")
def bad_bases(with_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    no_tok = root / "no_tokenizer"
    transformers.GPT2LMHeadModel.from_pretrained(with_tokenizer).save_pretrained(no_tok)
    small = root / "small_model"  # 300-token tokenizer, 200 embeddings
    transformers.AutoTokenizer.from_pretrained(with_tokenizer).save_pretrained(small)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=200, n_positions=32, n_embd=16, n_layer=1,
                                                          n_head=2)).save_pretrained(small)
    padded = root / "padded"  # 300-token tokenizer, 320 embeddings (vocabularies padded for speed)
    transformers.AutoTokenizer.from_pretrained(with_tokenizer).save_pretrained(padded)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=320, n_positions=32, n_embd=16, n_layer=1,
                                                          n_head=2)).save_pretrained(padded)
    wordpiece = root / "wordpiece"  # GPT-2 weights beside a BERT (WordPiece) tokenizer
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog"]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(wordpiece)
    transformers.GPT2LMHeadModel.from_pretrained(with_tokenizer).save_pretrained(wordpiece)
    bert = root / "bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(bert)
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("base, flags, message", [
    ("nope", [], r"the base .*nope: no such directory"),
    ("empty", [], r"has no config.json"),
    ("bert", [], r"is not a decoder \(it loads as qkv.Encoder\)"),
    ("no_tokenizer", [], r"has no tokenizer files"),
    ("wordpiece", [], r"tokenizer in .* is WordPiece; a run keeps BPE tokenizers"),
    ("small_model", [], r"tokenizer .* has \d+ tokens but the model only 200 embeddings"),
    ("gpt2", ["--d-model", "32"], r"takes the model's shape from the checkpoint"),
    ("gpt2", ["--tokenizer", "char"], r"keeps the checkpoint's own tokenizer"),
    ("gpt2", ["--task", "translate"], r"fine-tunes a decoder \(task lm, sft or dpo\)"),
    ("gpt2", ["--context", "64"], r"context 64 exceeds max_len 32"),
])
def test_bad_bases_are_one_line_and_write_nothing(bad_bases, with_tokenizer, text, tmp_path, capsys, base, flags,
                                                  message):
    path = with_tokenizer if base == "gpt2" else bad_bases / base
    out = tmp_path / "r"
    fails(capsys, ["train", "--init-from-hf", str(path), "--data", str(text), "--quiet", "--max-steps", "1",
                   "--out", str(out), *flags], message)
    assert not out.exists()


def test_a_padded_vocabulary_is_kept(bad_bases, text, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--init-from-hf", str(bad_bases / "padded"), "--data", str(text), *FAST,
                 "--max-steps", "1", "--out", str(out)]) == 0
    run = load_run(out)
    assert (run.config.vocab_size, run.tokenizer.vocab_size) == (320, 300)
