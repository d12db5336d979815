"""Hostile files: nothing executes, nothing huge is allocated, every problem is one clear error (exit 2)."""
import json
import pickle
import resource

import pytest
import torch

import qkv
from qkv.training import run_dir as ckpt
from qkv import cli
from qkv.data import CharTokenizer

TEXT = "def f(x):\n    return x * 2\n"


class Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def run_dir(tmp_path):
    tok = CharTokenizer.train(TEXT)
    ckpt.save_model(tmp_path / "run", qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    return tmp_path / "run"


def one_line_exit_2(argv, capsys):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_pickle_payload_in_train_state_is_refused_without_running(run_dir, tmp_path, capsys):
    marker = tmp_path / "pwned"
    (run_dir / "train_state.pt").write_bytes(pickle.dumps({"step": 1, "x": Payload(marker)}))
    (run_dir / "train_config.json").write_text(json.dumps({"preset": "tiny", "out": str(run_dir)}))
    with pytest.raises(ValueError, match="corrupt"):
        ckpt.load_train_state(run_dir)
    one_line_exit_2(["train", "--resume", "--out", str(run_dir), "--max-steps", "2"], capsys)
    assert not marker.exists()


def test_pickle_payload_as_weights_and_as_hf_bin_is_refused(run_dir, tmp_path, capsys):
    marker = tmp_path / "pwned"
    (run_dir / "model.safetensors").write_bytes(pickle.dumps(Payload(marker)))
    assert "corrupt" in one_line_exit_2(["sample", "--run", str(run_dir), "--prompt", "def"], capsys)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2}))
    (hf / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    one_line_exit_2(["sample", "--hf", str(hf), "--prompt", "def"], capsys)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip_data", "flip_header"])
def test_damaged_safetensors(run_dir, damage, capsys):
    path = run_dir / "model.safetensors"
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip_data":
        raw[-100] ^= 0x10  # a weight's bit: only the saved checksum can see it
    else:
        raw[20] ^= 0x55
    path.write_bytes(bytes(raw))
    err = one_line_exit_2(["sample", "--run", str(run_dir), "--prompt", "def"], capsys)
    assert "corrupt" in err or "does not match" in err


@pytest.mark.parametrize("edit,words", [
    ({"d_model": "32"}, "positive int"),
    ({"d_model": 10**9}, "absurd"),
    ({"num_layers": 100000, "d_model": 4096, "num_heads": 32}, "does not match"),  # ~2e13 parameters
    ({"vocab_size": 70}, "tokenizer"),
    ({"positional": ["rope"]}, "str"),
    ({"evil": 1}, "unknown"),
])
def test_config_with_wrong_types_or_absurd_sizes(run_dir, edit, words, capsys):
    cfg = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**cfg, **edit}))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err = one_line_exit_2(["sample", "--run", str(run_dir), "--prompt", "def"], capsys)
    assert words in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: nothing huge allocated


def test_tokenizer_that_does_not_match_the_checkpoint(run_dir, capsys):
    CharTokenizer("abc").save(run_dir)
    assert "tokenizer" in one_line_exit_2(["info", "--run", str(run_dir)], capsys)
    (run_dir / "tokenizer.json").write_text('{"qkv_tokenizer": "char", "chars": 5}')
    one_line_exit_2(["info", "--run", str(run_dir)], capsys)


def test_pickled_marian_checkpoint_is_refused_without_running(tmp_path, capsys):
    marker, hf = tmp_path / "pwned", tmp_path / "opus-mt"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "marian", "d_model": 16, "vocab_size": 32,
                                                "encoder_layers": 1, "decoder_layers": 1}))
    (hf / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ValueError, match="pickle files, which qkv never unpickles"):
        qkv.interop.from_hf(hf)
    one_line_exit_2(["sample", "--hf", str(hf), "--prompt", "def"], capsys)
    assert not marker.exists()
