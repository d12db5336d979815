"""`qkv train --positional/--d-model/--layers/--heads/--kv-heads/--model KEY=VALUE`: the model's shape
from the command line, over the preset, validated as config.json is."""
import json

import pytest
from test_cli_train import fails

pytestmark = pytest.mark.usefixtures("one_thread")

from qkv.cli import build_parser, main
from qkv.cli.train import train_config
from qkv.models import PRESETS, ModelConfig

FAST = ["--preset", "tiny", "--context", "16", "--batch-size", "4", "--eval-interval", "2", "--quiet",
        "--device", "cpu", "--sample-tokens", "0"]


def config(*argv):
    return train_config(build_parser().parse_args(["train", *argv]))


def test_flags_override_the_preset_field_by_field():
    cfg = config("--preset", "tiny", "--positional", "alibi", "--d-model", "48", "--layers", "3", "--heads", "6",
                 "--kv-heads", "2", "--model", "feed_forward.d_ff=64", "--model", "attention.q_bias=false",
                 "--model", "feed_forward.bias=false", "--model", "normalization.final=false",
                 "--model", "position.base=500", "--model", "normalization.kind=rmsnorm", "--max-steps", "1")
    m, tiny = cfg.model, PRESETS["tiny"]
    assert (m.position.kind, m.d_model, m.num_layers, m.attention.num_heads, m.attention.num_kv_heads) == ("alibi", 48, 3, 6, 2)
    assert (m.feed_forward.d_ff, m.attention.biases, m.feed_forward.bias, m.normalization.final, m.position.base,
            m.normalization.kind) == (64, (False, True, True, True), False, False, 500.0, "rmsnorm")
    assert (m.max_len, m.feed_forward.activation, m.head.tie) == (tiny.max_len, tiny.feed_forward.activation, tiny.head.tie)
    assert config("--preset", "tiny", "--max-steps", "1").model is None  # no flag: the preset itself


def test_a_flat_flag_and_its_sections_fields_are_checked_together():
    """--positional sets position.kind before position's checks run, so its own fields may come beside it."""
    m = config("--preset", "tiny", "--positional", "t5", "--model", "position.num_buckets=16", "--max-steps", "1").model
    assert (m.position.kind, m.position.num_buckets) == ("t5", 16)
    m = config("--preset", "tiny", "--positional", "rope", "--model", "position.rotary_dim=4", "--max-steps", "1").model
    assert (m.position.kind, m.position.rotary_dim) == ("rope", 4)


def test_the_preset_keeps_its_tokenizer():
    cfg = config("--layers", "2", "--max-steps", "1")  # demo: byte-level BPE, 2048 tokens
    assert (cfg.tokenizer, cfg.vocab_size, cfg.model.num_layers, cfg.model.position.kind) == ("bpe", 2048, 2, "rope")
    assert config("--layers", "2", "--tokenizer", "char", "--max-steps", "1").tokenizer == "char"


def test_a_run_trains_the_shape_asked_for_and_resumes_only_with_it(data, tmp_path, capsys):
    out = tmp_path / "r"
    shape = ["--positional", "rope", "--d-model", "24", "--heads", "4", "--kv-heads", "2", "--model", "feed_forward.d_ff=40"]
    assert main(["train", *FAST, *shape, "--data", str(data), "--max-steps", "2", "--out", str(out)]) == 0
    saved = ModelConfig.from_dict(json.loads((out / "config.json").read_text()))
    assert (saved.position.kind, saved.d_model, saved.attention.num_kv_heads, saved.feed_forward.d_ff) == ("rope", 24, 2, 40)
    assert main(["train", "--resume", "--out", str(out), *shape, "--max-steps", "4", "--quiet",
                 "--sample-tokens", "0"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    fails(capsys, ["train", "--resume", "--out", str(out), "--d-model", "32", "--max-steps", "6"],
          r"changed config \(model: .*'d_model': 24.*'d_model': 32")


@pytest.mark.parametrize("flags, message", [
    (["--model", "depth=3"], r"unknown ModelConfig field 'depth'"),
    (["--model", "d_model=wide"], r"d_model=wide: expected an int"),
    (["--model", "feed_forward.d_ff=x"], r"feed_forward.d_ff=x: expected an int or none"),
    (["--model", "feed_forward.bias=yes"], r"bias=yes: expected true or false"),
    (["--model", "position.base=fast"], r"expected a float"),
    (["--model", "num_heads=4"], r"num_heads=4: num_heads is attention.num_heads: pass --model attention.num_heads=4"),
    (["--model", "bias=false"], r"set each, e.g. --model attention.q_bias=false --model feed_forward.bias=false"),
    (["--model", "vocab_size=99"], r"comes from the tokenizer"),
    (["--model", "feed_forward.d_ff"], r"expects KEY=VALUE"),
    (["--model", "position.kind=spiral"], r"positional must be one of"),
    (["--d-model", "30", "--heads", "4"], r"divisible by num_heads"),
    (["--heads", "4", "--kv-heads", "3"], r"multiple of num_kv_heads"),
    (["--layers", "0"], r"num_layers must be a positive int"),
    (["--d-model", "64", "--model", "d_model=32"], r"disagree \(64 vs 32\)"),
    (["--d-model", "abc"], r"invalid int value"),
])
def test_bad_shapes_are_one_line_and_write_nothing(data, tmp_path, capsys, flags, message):
    out = tmp_path / "r"
    fails(capsys, ["train", *FAST, *flags, "--data", str(data), "--max-steps", "1", "--out", str(out)], message)
    assert not out.exists()


def test_the_named_flags_are_declared_on_their_fields():
    """--heads & co. come from the fields' metadata: the same names, types and help as the table they replace."""
    from qkv.cli.model_flags import MODEL_FLAGS

    assert MODEL_FLAGS == {
        "--positional": ("position.kind", str, "positional encoding: sinusoidal, learned, rope, alibi, t5 or none"),
        "--d-model": ("d_model", int, "model width"),
        "--layers": ("num_layers", int, "number of Transformer blocks"),
        "--heads": ("attention.num_heads", int, "attention heads (must divide --d-model)"),
        "--kv-heads": ("attention.num_kv_heads", int, "key/value heads: grouped-query attention (must divide --heads)"),
    }
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert all(flag in text for flag in MODEL_FLAGS)
