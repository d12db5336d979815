import json

import pytest
import torch

import qkv
from qkv.training import run_dir as ckpt
from qkv.data import CharTokenizer

TEXT = "def f(x):\n    return x * 2\n"


@pytest.fixture
def saved(tmp_path):
    tok = CharTokenizer.train(TEXT)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size, position=dict(kind="rope")))
    ckpt.save_model(tmp_path, model, tok, step=7)
    return tmp_path, model, tok


def test_save_and_load_run_round_trip(saved):
    path, model, tok = saved
    assert {p.name for p in path.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json"}
    run = ckpt.load_run(path)
    assert not run.model.training and run.path == path and run.config == model.config
    assert run.model.lm_head.weight is run.model.embed.tok.weight  # the tie survives
    ids = torch.tensor([tok.encode(TEXT)])
    torch.testing.assert_close(run.model(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)
    assert run.tokenizer.encode(TEXT) == tok.encode(TEXT)
    assert ckpt.weights_step(path) == 7


def test_run_sample_is_reproducible_and_checks_the_prompt(saved):
    run = ckpt.load_run(saved[0])
    a = run.sample("def", 20, temperature=1.0, seed=3)
    assert a.startswith("def") and len(a) == 23
    assert run.sample("def", 20, seed=3) == a
    with pytest.raises(ValueError, match="outside"):
        run.sample("déf", 5)
    with pytest.raises(ValueError, match="empty"):
        run.sample("", 5)


def test_atomic_write_replaces_whole_file_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    ckpt.atomic_write(target, b"old")
    ckpt.atomic_write(target, b"new")
    assert target.read_bytes() == b"new"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "replace", broken_replace)
    with pytest.raises(OSError):
        ckpt.atomic_write(target, b"half")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize("damage, message", [
    ("remove:model.safetensors", "not a qkv run: missing model.safetensors"),
    ("truncate:model.safetensors", "corrupt or truncated"),
    ("garbage:model.safetensors", "corrupt or truncated"),
    ("garbage:config.json", "not valid JSON"),
    ("badkey:config.json", "unknown ModelConfig keys"),
    ("wrongvocab:config.json", "vocab_size"),
    ("garbage:tokenizer.json", "not valid JSON"),
])
def test_load_run_rejects_damaged_runs(saved, damage, message):
    path = saved[0]
    kind, name = damage.split(":")
    f = path / name
    if kind == "remove":
        f.unlink()
    elif kind == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif kind == "garbage":
        f.write_bytes(b"\x00garbage{")
    elif kind == "badkey":
        f.write_text(json.dumps(json.loads(f.read_text()) | {"surprise": 1}))
    elif kind == "wrongvocab":
        f.write_text(json.dumps(json.loads(f.read_text()) | {"vocab_size": 99}))
    with pytest.raises(ValueError, match=message):
        ckpt.load_run(path)


def test_load_run_of_a_plain_directory(tmp_path):
    with pytest.raises(ValueError, match="not a qkv run: missing config.json, model.safetensors, tokenizer.json"):
        ckpt.load_run(tmp_path)
    with pytest.raises(ValueError, match="no such directory"):
        ckpt.load_run(tmp_path / "nope")


class Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_train_state_is_read_with_weights_only(tmp_path):
    ckpt.save_train_state(tmp_path, {"step": 3, "t": torch.ones(2)})
    assert ckpt.load_train_state(tmp_path)["step"] == 3
    torch.save({"step": 3, "evil": Evil()}, tmp_path / ckpt.STATE_FILE)  # arbitrary code on unpickling
    with pytest.raises(ValueError, match="corrupt or truncated"):
        ckpt.load_train_state(tmp_path)
    (tmp_path / ckpt.STATE_FILE).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        ckpt.load_train_state(tmp_path)
