"""benchmarks.demo_levers and train_speed's demo-shape contenders: every variant is a valid training config
(checked before any run), and qkv and HF compute the same function at the demo's shape. No timing here."""
import json
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks is a package beside src/, run as python -m benchmarks

from benchmarks import demo_levers, train_speed  # noqa: E402
import qkv  # noqa: E402
from qkv.kernels.training import TrainingAttention  # noqa: E402
from qkv.models import PRESETS  # noqa: E402
from qkv.training.recipe import TrainConfig  # noqa: E402


@pytest.mark.parametrize("name", list(demo_levers.VARIANTS))
def test_every_variant_is_a_valid_config(name):
    cfg = TrainConfig(max_minutes=0.1, **demo_levers.settings(name))
    assert cfg.tokenizer == "bpe"  # a variant of the model keeps the demo's tokenizer


def test_variants_combine_and_a_typo_is_named():
    both = demo_levers.settings("muon+wsd+qk-norm")
    assert both["optimizer"] == "muon" and both["schedule"] == "wsd" and both["model"].attention.qk_norm
    with pytest.raises(SystemExit, match="unknown variant 'mu0n'; choose from baseline, muon"):
        demo_levers.settings("mu0n+wsd")


def test_the_demo_shape_with_nanogpts_choices():
    c, demo = train_speed.demo_gpt2_config(), PRESETS["demo"]
    assert (c.d_model, c.num_layers, c.attention.num_heads, c.max_len) == (demo.d_model, demo.num_layers, demo.attention.num_heads,
                                                                 demo.max_len)
    assert (c.position.kind, c.normalization.kind, c.feed_forward.activation, c.feed_forward.bias) == \
        ("learned", "layernorm", "gelu", True)
    contenders, x = train_speed.demo_contenders(None, batch=2)  # asserts the first losses equal
    assert set(contenders) == {"qkv", "qkv + speed layer", "HF"} and x.shape == (2, c.max_len + 1)
    with pytest.raises(SystemExit, match="expects the path of nanoGPT's model.py"):
        train_speed.load_nanogpt(str(ROOT / "no-such-model.py"))


def fake_run(variant, bpc, steps=100):
    return {"variant": variant, "val_bpc": bpc, "xz_bpc": 1.5, "gzip_bpc": 1.85, "steps": steps,
            "tokens_per_s": 9000.0, "threads": 1}


def test_the_page_says_when_where_and_how_and_compares_with_the_baseline(tmp_path):
    runs = [fake_run("baseline", 1.40), fake_run("adamw+cosine", 1.52)]
    stamp = demo_levers.stamp_now("python -m benchmarks.demo_levers --jobs 2")
    written = demo_levers.write_page(tmp_path, runs, 3.0, 2, stamp)
    en, zh = (tmp_path / "generated" / name for name in ("demo-levers.md", "demo-levers.zh.md"))
    assert set(written) >= {en, zh}
    text = en.read_text()
    assert "`python -m benchmarks.demo_levers --jobs 2`" in text and "Machine:" in text and "commit" in text
    assert re.search(r"\| `adamw\+cosine` +\| AdamW for every weight \+ warmup then cosine decay +\| alone +\|", text)
    assert "+0.120" in text
    assert "0.933" in text and "xz -9e 1.500" in text and "2 at a time" in text
    assert "所有权重都用 AdamW + 预热后余弦衰减" in zh.read_text()
    with pytest.raises(SystemExit, match="expected the documentation folder"):
        demo_levers.write_page(tmp_path / "nope", runs, 3.0, 1, demo_levers.stamp_now("x"))


def test_jobs_beyond_the_cores_are_refused_before_any_run(capsys):
    with pytest.raises(SystemExit, match="--jobs must be between 1 and the"):
        demo_levers.main(["--jobs", "999", "--variant", "baseline"])
    with pytest.raises(SystemExit, match="unknown variant"):
        demo_levers.main(["--variant", "baseline+nope"])


def test_the_bf16_contenders_compute_the_same_loss_to_bf16_rounding_the_speed_layers_on_its_path():
    contenders, x = train_speed.demo_contenders(None, batch=2)
    fast = contenders["qkv + speed layer"][0]
    assert {type(b.attn) for b in fast.blocks} == {TrainingAttention}
    assert {type(b.attn) for b in contenders["qkv"][0].blocks} == {qkv.MultiHeadAttention}
    for name in ("qkv", "qkv + speed layer"):
        model, loss = contenders[name]
        with torch.no_grad():
            full, half = loss(model, x), train_speed.bf16_loss(loss)(model, x)
        assert half.dtype == torch.float32 and abs(full.item() - half.item()) < 0.02 and full.item() != half.item()


def test_the_pages_are_written_again_from_the_saved_json_with_its_stamp(tmp_path):
    runs = [fake_run("baseline", 1.40) | {"batch": 1}, fake_run("lr-2x", 1.35) | {"batch": 1}]
    demo_levers.write_page(tmp_path, runs, 3.0, 2, demo_levers.stamp_now("python -m benchmarks.demo_levers --jobs 2"))
    saved = tmp_path / "generated" / "demo-levers.json"
    data = json.loads(saved.read_text())
    data["date"], data["commit"] = "2026-01-02", "abc1234"
    saved.write_text(json.dumps(data))
    (tmp_path / "generated" / "demo-levers.md").unlink()
    table = demo_levers.main(["--from-json", str(saved), "--markdown", str(tmp_path)])
    text = re.sub(" +", " ", (tmp_path / "generated" / "demo-levers.md").read_text())
    assert "on 2026-01-02 at commit `abc1234`" in text and "| `lr-2x` | twice the peak learning rate | 1 |" in text
    assert "-0.050" in table
    with pytest.raises(SystemExit, match="give --markdown DOCS too"):
        demo_levers.main(["--from-json", str(saved)])
