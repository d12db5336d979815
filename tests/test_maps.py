"""qkv.viz.maps: the one place attention maps are taken from a model."""
import sys

import pytest
import torch

import qkv
from qkv.viz import maps


def tiny(num_layers=3, num_heads=2, dropout=0.0):
    cfg = qkv.ModelConfig(vocab_size=16, d_model=16, attention=dict(num_heads=num_heads), num_layers=num_layers,
                          max_len=16, dropout=dropout)
    return qkv.GPT(cfg)


def test_shapes_and_equivalence_with_the_models_own_output():
    model = tiny().eval()
    ids = torch.randint(0, 16, (2, 5))
    att = maps.attention_weights(model, ids)
    assert att.shape == (3, 2, 2, 5, 5) and att.dtype == torch.float32
    with torch.no_grad():
        ref = torch.stack(model(ids, return_attention=True).attentions)  # (N, B, H, T, T)
    assert torch.equal(att, ref)
    one = maps.attention_maps(model, ids[1])  # (T,) -> (N, H, T, T)
    assert one.shape == (3, 2, 5, 5) and torch.equal(one, maps.attention_maps(model, ids[1:]))  # (1, T) alike
    torch.testing.assert_close(one, ref[:, 1], atol=1e-6, rtol=0)  # batched apart: equal up to float error


def test_runs_in_eval_mode_and_restores_the_mode():
    model = tiny(dropout=0.5).train()
    ids = torch.arange(6)
    a, b = maps.attention_maps(model, ids), maps.attention_maps(model, ids)
    assert torch.equal(a, b) and model.training  # no dropout while measuring; training mode given back
    assert maps.model_device(model) == torch.device("cpu") == maps.model_device(torch.nn.ReLU())


def test_bad_input():
    with pytest.raises(TypeError, match="nn.Module"):
        maps.attention_maps("gpt", torch.arange(3))
    with pytest.raises(TypeError, match="cannot be explored"):
        maps.attention_maps(qkv.Transformer(qkv.ModelConfig.preset("tiny")), torch.arange(3))
    with pytest.raises(ValueError, match=r"expected ids \(B, T\), got shape \(3,\)"):
        maps.attention_weights(tiny(), torch.arange(3))


def test_the_package_imports_no_matplotlib():
    import subprocess

    code = "import sys, qkv.viz, qkv.viz.maps, qkv.viz.explorer, qkv.claims; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
