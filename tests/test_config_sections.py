"""ModelConfig as component sections: each validated once, one spelling (a flat name is refused with its section
field named, except in a config.json, read and said once), config.json written before the sections still loads
(with the same outputs), and the factory builds blocks whose attention class is data (a registered kind), not a
code edit."""
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import qkv
from qkv.models import (
    AttentionConfig, FeedForwardConfig, HeadConfig, ModelConfig, NormConfig, PositionConfig,
)
from qkv.models import components
from qkv.models import config as config_module
from qkv.training.run_dir import load_run

BEFORE = Path(__file__).parent / "data" / "runs_before_sections"


@pytest.fixture
def unsaid(monkeypatch):
    """This test's process has said no flat name yet."""
    monkeypatch.setattr(config_module, "SAID_FLAT", set())


def test_a_flat_config_json_and_sections_build_the_same_config(unsaid):
    with pytest.warns(config_module.FlatConfigNames):
        flat = ModelConfig.from_dict(dict(d_model=64, num_heads=8, num_kv_heads=2, positional="rope", rope_base=500.0,
                                          d_ff=96, activation="swiglu", norm="rmsnorm", norm_eps=1e-6, bias=False,
                                          tie_embeddings=False))
    sections = ModelConfig(
        d_model=64, attention=AttentionConfig(num_heads=8, num_kv_heads=2, q_bias=False, k_bias=False, v_bias=False,
                                              out_bias=False),
        position=PositionConfig(kind="rope", base=500.0), feed_forward=FeedForwardConfig(96, "swiglu", bias=False),
        normalization=NormConfig(kind="rmsnorm", eps=1e-6), head=HeadConfig(tie=False))
    assert flat == sections
    assert (flat.attention.num_heads, flat.attention.num_kv_heads, flat.position.kind, flat.feed_forward.d_ff,
            flat.normalization.kind, flat.attention.biases, flat.feed_forward.bias, flat.head_dim, flat.kv_heads,
            flat.ff_width) == (8, 2, "rope", 96, "rmsnorm", (False,) * 4, False, 8, 2, 96)


@pytest.mark.parametrize("build", [lambda: ModelConfig(d_model=64, num_heads=8),
                                   lambda: ModelConfig.preset("tiny", num_heads=8),
                                   lambda: ModelConfig.preset("tiny").replace(num_heads=8)])
def test_a_flat_keyword_is_refused_with_its_section_spelling(build):
    with pytest.raises(TypeError, match=r"num_heads is attention.num_heads: pass attention=AttentionConfig\(num_heads=8\) "
                                        r"or attention=\{'num_heads': 8\}"):
        build()
    with pytest.raises(TypeError, match=r"bias sets attention.q_bias, k_bias, v_bias, out_bias and feed_forward.bias"):
        ModelConfig(bias=False)
    with pytest.raises(AttributeError):
        ModelConfig().num_heads  # noqa: B018  (read as config.attention.num_heads)


def test_a_flat_config_json_is_said_once_per_name(unsaid):
    with pytest.warns(config_module.FlatConfigNames, match=r"num_heads -> attention.num_heads, "
                                                           r"positional -> position.kind"):
        ModelConfig.from_dict({"num_heads": 2, "positional": "rope"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ModelConfig.from_dict({"num_heads": 4}).attention.num_heads == 4  # said already
        ModelConfig.from_dict(ModelConfig.preset("demo").to_dict())  # sections: nothing to say
    with pytest.warns(config_module.FlatConfigNames, match=r"\(d_ff -> feed_forward.d_ff\)"):
        ModelConfig.from_dict({"num_heads": 4, "d_ff": 32})


def test_to_dict_is_nested_readable_and_round_trips():
    c = ModelConfig.preset("demo")
    d = json.loads(json.dumps(c.to_dict()))
    assert set(d) == {"vocab_size", "d_model", "num_layers", "max_len", "dropout", "num_decoder_layers",
                      "layer_types", "attention", "position", "feed_forward", "normalization", "embedding", "head"}
    assert d["attention"]["num_heads"] == 4 and d["position"]["kind"] == "rope"
    assert ModelConfig.from_dict(d) == c
    assert ModelConfig(**(c.to_dict() | {"num_layers": 3})).num_layers == 3


def test_a_flat_name_over_a_section_sets_that_field(unsaid):
    c = ModelConfig.preset("tiny")
    with pytest.warns(config_module.FlatConfigNames):
        assert ModelConfig.from_dict({**c.to_dict(), "rope_interleaved": True}).position.interleaved is True
    assert c.replace(feed_forward={"d_ff": 77}).feed_forward.d_ff == 77 and c.feed_forward.d_ff is None  # a copy
    assert c.replace(attention={"num_kv_heads": 2}).attention == AttentionConfig(num_heads=4, num_kv_heads=2)


def test_final_norm_follows_norm_first_as_it_did(unsaid):
    with pytest.warns(config_module.FlatConfigNames):
        assert ModelConfig.from_dict({"norm_first": False}).normalization.final is False
    assert ModelConfig.from_dict({"norm_first": False, "final_norm": None}).normalization.final is False
    assert ModelConfig.from_dict({"norm_first": False, "final_norm": True}).normalization.final is True
    assert ModelConfig().has_final_norm is True


def test_per_projection_bias_and_head_dim_apart_from_the_width():
    c = ModelConfig(d_model=48, attention=AttentionConfig(num_heads=4, head_dim=16, out_bias=False))
    m = qkv.GPT(c)
    attn = m.blocks[0].attn
    assert (attn.q_proj.weight.shape, attn.out_proj.weight.shape) == ((64, 48), (48, 64))
    assert attn.q_proj.bias is not None and attn.out_proj.bias is None
    assert c.attention.biases == (True, True, True, False)
    out = m(torch.randint(0, c.vocab_size, (2, 5)))
    assert out.logits.shape == (2, 5, c.vocab_size)


@pytest.mark.parametrize("bad, message", [
    (dict(attention=dict(num_heads=0)), "num_heads must be a positive int"),
    (dict(d_model=30, attention=dict(num_heads=4)), r"d_model \(30\) must be divisible by num_heads \(4\)"),
    (dict(position=dict(kind="spiral")), "positional must be one of"),
    (dict(feed_forward=dict(activation="tanh")), "activation must be one of"),
    (dict(normalization=dict(kind="batchnorm")), "norm must be one of"),
    (dict(layer_types=["full_attention"]), "layer_types must name each of the 4 layers"),
    (dict(layer_types=["windowed"] * 4), r"unknown layer_types \['windowed'\]"),
    (dict(attention=AttentionConfig(num_heads=4, head_dim=7), position=dict(kind="rope")), "RoPE needs an even head_dim"),
    (dict(dropout=1.5), r"dropout must be in \[0, 1\)"),
])
def test_bad_values_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**bad)


def test_from_dict_refuses_unknown_keys_and_wrong_types():
    d = ModelConfig().to_dict()
    with pytest.raises(ValueError, match=r"unknown ModelConfig keys: \['n_embd'\]"):
        ModelConfig.from_dict(d | {"n_embd": 3})
    with pytest.raises(ValueError, match=r"unknown ModelConfig.attention keys: \['heads'\]"):
        ModelConfig.from_dict(d | {"attention": {"heads": 4}})
    with pytest.raises(TypeError, match="ModelConfig.normalization.first must be a bool"):
        ModelConfig.from_dict(d | {"normalization": {"first": "yes"}})
    with pytest.raises(TypeError, match="ModelConfig.norm_first must be a bool"):
        ModelConfig.from_dict({"norm_first": "yes"})
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        ModelConfig(depth=3)


def test_sections_are_frozen_so_a_field_cannot_be_set_past_its_section():
    c = ModelConfig()
    with pytest.raises(AttributeError):
        c.num_heads = 8
    with pytest.raises(AttributeError):
        c.attention.num_heads = 8


@pytest.mark.parametrize("name", ["gpt", "transformer", "encoder"])
def test_a_run_written_before_the_sections_loads_with_the_same_outputs(name):
    """tests/data/runs_before_sections/*: written by qkv at 0db7a50 (the flat ModelConfig) with
    qkv.checkpoint.save_model from torch.manual_seed(0) models (the Transformer's logits bias drawn from N(0, 1)),
    and the output of the last position for the ids in expected.json, computed then."""
    d = BEFORE / name
    flat = json.loads((d / "config.json").read_text())
    assert "num_heads" in flat and "attention" not in flat  # really the old layout
    run = load_run(d)
    expected = json.loads((d / "expected.json").read_text())
    ids = torch.tensor([expected["ids"]])
    with torch.no_grad():
        if isinstance(run.model, qkv.Transformer):
            out = run.model(ids, ids[:, :5]).logits
        elif isinstance(run.model, qkv.Encoder):
            out = run.model(ids).last_hidden_state
        else:
            out = run.model(ids).logits
    torch.testing.assert_close(out[0, -1], torch.tensor(expected["output"]), rtol=1e-5, atol=1e-5)
    assert ModelConfig.from_dict(run.model.config.to_dict()) == run.model.config


def test_old_flat_config_reads_as_the_right_sections():
    c = ModelConfig.from_dict(json.loads((BEFORE / "transformer" / "config.json").read_text()))
    assert (c.position.kind, c.position.sinusoidal_layout, c.normalization.first, c.normalization.final) == (
        "sinusoidal", "split", False, False)
    assert (c.head.bias, c.embedding.scale, c.embedding.init_std, c.num_decoder_layers) == (True, True, 0.25, 1)


class ScaledAttention(qkv.MultiHeadAttention):
    """A new attention class: multi-head attention with its output halved (a stand-in for a real variant)."""

    def forward(self, x, *args, **kwargs):
        out = super().forward(x, *args, **kwargs)
        return (out[0] / 2, out[1]) if isinstance(out, tuple) else out / 2


def test_a_new_attention_kind_plugs_in_as_data(monkeypatch):
    monkeypatch.setitem(components.ATTENTIONS, "halved", lambda config, layer: ScaledAttention(
        config.d_model, config.attention.num_heads, rope=layer.rope))
    config = ModelConfig.preset("tiny", position=dict(kind="rope"),
                                attention=AttentionConfig(kind="halved", num_heads=4))
    model = qkv.GPT(config)
    assert all(type(b.attn) is ScaledAttention for b in model.blocks)
    assert model.blocks[0].attn.rope is model.blocks[1].attn.rope  # one shared RoPE, as for mha
    model(torch.randint(0, 64, (1, 4)))
    with pytest.raises(ValueError, match="attention.kind 'nope' is not registered"):
        qkv.GPT(ModelConfig.preset("tiny", attention=AttentionConfig(kind="nope")))


def test_register_attention_checks_its_arguments():
    with pytest.raises(TypeError, match="register_attention takes a kind"):
        components.register_attention("", lambda c, layer: nn.Identity())


def test_layer_types_are_per_block_and_the_encoder_decoder_needs_one_depth():
    c = ModelConfig.preset("tiny", layer_types=["full_attention", "full_attention"])
    assert [c.layer_type(i) for i in range(2)] == ["full_attention"] * 2
    qkv.GPT(c)
    with pytest.raises(ValueError, match="layer_types names 2 layers, but the decoder has 3"):
        qkv.Transformer(c.replace(num_decoder_layers=3))
