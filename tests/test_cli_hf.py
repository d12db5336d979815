"""`qkv sample --hf` and `qkv plot attention --hf`: a Hugging Face directory (GPT-2, GPT-NeoX) from the command line."""
import shutil

import pytest
import torch

from qkv import cli
from qkv.interop.hf import load_pretrained

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")


@pytest.fixture(scope="module")
def gpt_neox_dir(with_tokenizer, tmp_path_factory):
    """A Pythia-shaped GPTNeoXForCausalLM (parallel residual, a quarter of each head rotated) beside
    with_tokenizer's tokenizer."""
    d = tmp_path_factory.mktemp("gpt_neox")
    for f in with_tokenizer.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, d / f.name)
    torch.manual_seed(0)
    transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, rotary_pct=0.25, use_parallel_residual=True, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)).save_pretrained(d)
    return d


@pytest.mark.parametrize("directory, hf_class", [("with_tokenizer", "GPT2LMHeadModel"),
                                                  ("gpt_neox_dir", "GPTNeoXForCausalLM")])
def test_sample_hf_matches_hf_greedy_generate(request, directory, hf_class, capsys):
    d = request.getfixturevalue(directory)
    assert cli.main(["sample", "--hf", str(d), "--prompt", "the dog", "--max-new-tokens", "8",
                     "--temperature", "0"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    tok = transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)
    hf = getattr(transformers, hf_class).from_pretrained(d).eval()
    ids = torch.tensor([tok.encode("the dog")])
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           pad_token_id=0, eos_token_id=tok.eos_token_id)
    assert text == tok.decode(expected[0])


def test_sample_hf_is_reproducible_with_a_seed(with_tokenizer, capsys):
    argv = ["sample", "--hf", str(with_tokenizer), "--prompt", "the", "--max-new-tokens", "6", "--seed", "4"]
    assert cli.main(argv) == 0 and cli.main(argv) == 0
    a, b = capsys.readouterr().out.splitlines()[:2]
    assert a == b and a.startswith("the")


def test_plot_attention_hf(with_tokenizer, tmp_path, capsys):
    assert cli.main(["plot", "attention", "--hf", str(with_tokenizer), "--text", "the man bites",
                     "--out", str(tmp_path)]) == 0
    assert (tmp_path / "attention.png").stat().st_size > 1000


def test_bad_hf_sources(with_tokenizer, tmp_path, capsys):
    for argv, words in (
        (["sample", "--hf", str(tmp_path / "nope"), "--prompt", "a"], "no such model directory"),
        (["sample", "--hf", str(tmp_path), "--prompt", "a"], "config.json"),
        (["sample", "--hf", str(with_tokenizer), "--run", str(tmp_path), "--prompt", "a"], "not allowed"),
        (["sample", "--hf", str(with_tokenizer), "--prompt", ""], "empty"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    model, tok = load_pretrained(with_tokenizer)
    assert tok is not None and model.config.max_len == 32


def test_sample_bf16_autocast(with_tokenizer, capsys):
    assert cli.main(["sample", "--hf", str(with_tokenizer), "--prompt", "the dog", "--max-new-tokens", "5",
                     "--bf16", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("the dog")

