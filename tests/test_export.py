"""`qkv export --run DIR --hf OUT`: a run as a directory transformers loads without qkv (checked in a
subprocess where qkv cannot be imported), logits within 1e-4 of qkv's."""
import json
import os
import subprocess
import sys

import pytest
import torch

import qkv
from qkv.training.run_dir import load_run, save_model
from qkv.cli import main
from qkv.data import BPETokenizer, CharTokenizer

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

TEXT = "def f(x):\n    return x * 2  # é ✓\n" * 20
LOAD_WITHOUT_QKV = """
import json, sys
sys.modules["qkv"] = None  # qkv cannot be imported: what transformers loads stands alone
import torch, transformers
d, text = sys.argv[1], sys.argv[2]
tok = transformers.AutoTokenizer.from_pretrained(d)
model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
ids = tok(text, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits[0]
print(json.dumps({"class": type(model).__name__, "ids": ids[0].tolist(), "text": tok.decode(ids[0]),
                  "logits": logits.tolist()}))
"""


def hf_load(out, text):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_QKV, str(out), text], capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def make_run(path, tokenizer, **shape):
    """A run directory holding a random GPT (every weight perturbed, so norms and biases count too)."""
    model = qkv.GPT(qkv.ModelConfig(vocab_size=tokenizer.vocab_size, d_model=32, attention=dict(num_heads=4),
                                    num_layers=2, max_len=64).replace(**shape))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(path, model, tokenizer)
    return path


GPT2 = dict(position=dict(kind="learned"), feed_forward=dict(activation="gelu_tanh"))
LLAMA = dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False, num_kv_heads=2),
             position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
             normalization=dict(kind="rmsnorm"), head=dict(tie=False))
DEMO = dict(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False), position=dict(kind="rope"),
            feed_forward=dict(bias=False))  # the demo preset's architecture (RoPE, LayerNorm, GELU, tied), tiny


@pytest.mark.parametrize("shape, tokenizer, hf_class", [
    (GPT2, "char", "GPT2LMHeadModel"), (LLAMA, "bpe", "LlamaForCausalLM"), (DEMO, "bpe", "GPTNeoXForCausalLM")])
def test_export_loads_in_transformers_alone_with_the_same_logits(tmp_path, capsys, shape, tokenizer, hf_class):
    tok = CharTokenizer.train(TEXT) if tokenizer == "char" else BPETokenizer.train(TEXT, 300)
    run = make_run(tmp_path / "run", tok, **shape)
    out = tmp_path / "exports" / "hf"  # the parent is created too
    assert main(["export", "--run", str(run), "--hf", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = "def f(x):\n    return 2 * x  # ✓ é"
    got = hf_load(out, text)
    loaded = load_run(run)
    ids = loaded.tokenizer.encode(text)
    assert got["class"] == hf_class and got["ids"] == ids and got["text"] == text
    with torch.no_grad():
        expected = loaded.model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, atol=1e-4, rtol=0)
    assert sorted(p.name for p in out.parent.iterdir()) == ["hf"]  # no temporary directory left


def test_out_is_refused_when_taken_unless_overwrite(tmp_path, capsys):
    run = make_run(tmp_path / "run", CharTokenizer.train(TEXT), **GPT2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["export", "--run", str(run), "--hf", str(out)]) == 2
    assert "not empty; pass --overwrite" in capsys.readouterr().err and (out / "mine.txt").is_file()
    assert main(["export", "--run", str(run), "--hf", str(out), "--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


@pytest.mark.parametrize("shape, message", [
    (dict(position=dict(kind="rope"), normalization=dict(kind="rmsnorm")),
     r"no Hugging Face LLaMA counterpart for this model: "
     r"feed_forward.activation='gelu' \(needs one of \['geglu', 'geglu_tanh', 'swiglu'\]\)"),
    (dict(position=dict(kind="rope"), feed_forward=dict(activation="swiglu")),
     r"no Hugging Face GPT-NeoX counterpart for this model: feed_forward.activation='swiglu' \(needs one of "
     r"\['gelu', 'gelu_tanh'"),
    (dict(position=dict(kind="alibi")), r"position.kind='learned' \(GPT-2\) or .* \(GPT-NeoX\) or .*; got position.kind='alibi'"),
    (dict(position=dict(kind="learned"), normalization=dict(first=False, final=False)), r"normalization.first=False \(needs True\)"),
    # what GPT-2 and LLaMA would otherwise drop or compute differently, without a word
    (dict(position=dict(kind="learned"), head=dict(bias=True)), r"GPT-2 counterpart.*head.bias=True \(needs False\)"),
    (dict(position=dict(kind="learned"), feed_forward=dict(parallel=True)), r"feed_forward.parallel=True \(GPT-2's blocks"),
    (dict(position=dict(kind="rope"), feed_forward=dict(activation="swiglu"), normalization=dict(kind="rmsnorm"),
          head=dict(bias=True)),
     r"LLaMA counterpart.*head.bias=True \(needs False\)"),
    (dict(position=dict(kind="rope", rotary_dim=4), feed_forward=dict(activation="swiglu"),
          normalization=dict(kind="rmsnorm")),
     r"Phi-3 counterpart.*attention biases .* \(Phi-3 has none\)"),  # LLaMA rotates every dimension; Phi-3 need not
    (dict(position=dict(kind="rope"), feed_forward=dict(activation="swiglu"), normalization=dict(kind="rmsnorm"),
          attention=dict(num_heads=4, qk_norm=True)),
     r"Qwen3 counterpart .*feed_forward.bias=True \(Qwen3's MLP has no bias\)"),
    (dict(position=dict(kind="rope"), feed_forward=dict(activation="swiglu"), normalization=dict(kind="rmsnorm"),
          attention=dict(num_heads=4, sliding_window=8)),
     r"attention.sliding_window=8 \(needs None\)"),
    (dict(position=dict(kind="learned"), head=dict(softcap=30.0)), r"GPT-2 counterpart.*head.softcap=30.0 \(needs None\)"),
])
def test_architectures_without_an_hf_counterpart_are_refused(tmp_path, capsys, shape, message):
    import re

    run = make_run(tmp_path / "run", CharTokenizer.train(TEXT), **shape)
    out = tmp_path / "new" / "hf"
    assert main(["export", "--run", str(run), "--hf", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not (tmp_path / "new").exists()


def test_not_a_run_and_not_a_decoder(tmp_path, capsys):
    assert main(["export", "--run", str(tmp_path / "none"), "--hf", str(tmp_path / "out")]) == 2
    assert "not a qkv run" in capsys.readouterr().err
    tok = CharTokenizer.train(TEXT)
    save_model(tmp_path / "mt", qkv.Transformer(qkv.ModelConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    assert main(["export", "--run", str(tmp_path / "mt"), "--hf", str(tmp_path / "out")]) == 2
    assert "holds a Transformer" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_demo_preset_run_exports_as_gpt_neox(tmp_path, capsys):
    """`qkv train --preset demo` (shrunk: the preset's RoPE, LayerNorm, GELU, no biases, tied head) then
    `qkv export`: transformers loads a GPTNeoXForCausalLM alone and computes the run's logits."""
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    run, out = tmp_path / "runs" / "demo", tmp_path / "out"
    assert main(["train", "--preset", "demo", "--data", str(data), "--d-model", "32", "--layers", "2", "--heads", "4",
                 "--vocab-size", "300", "--max-steps", "2", "--batch-size", "4", "--context", "32", "--out", str(run),
                 "--quiet", "--sample-tokens", "0"]) == 0
    loaded = load_run(run)
    c = loaded.model.config
    assert (c.position.kind, c.normalization.kind, c.feed_forward.activation, c.attention.biases, c.feed_forward.bias,
            c.head.tie) == ("rope", "layernorm", "gelu", (False,) * 4, False, True)
    assert main(["export", "--run", str(run), "--hf", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = "def f(x):\n    return x * 2"
    got = hf_load(out, text)
    ids = loaded.tokenizer.encode(text)
    assert got["class"] == "GPTNeoXForCausalLM" and got["ids"] == ids
    with torch.no_grad():
        expected = loaded.model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, atol=1e-5, rtol=0)
