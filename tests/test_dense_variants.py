"""The reference-layer parts of SmolLM3, OLMo 2 and Phi-3's families: NoPE layers (position.nope_layers), the norm
after each sublayer (normalization.post_sublayer) and QK-norm over the whole projection
(attention.qk_norm_scope="projection"), each against its formula written out here, cached against uncached, and
their errors. Hugging Face parity: tests/test_interop_dense.py."""
import pytest
import torch

import qkv
from qkv.models import ModelConfig
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.block import PostSublayerTransformerBlock
from qkv.nn.layers import ProjectionRMSNorm


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def olmo_like(**overrides) -> ModelConfig:
    """Tiny OLMo-2 shape with NoPE layers 1 and 3 (SmolLM3's) as well: every new variant on."""
    sections = dict(attention=dict(num_heads=4, num_kv_heads=2, qk_norm=True, qk_norm_scope="projection"),
                    position=dict(kind="rope", nope_layers=[1, 3]), feed_forward=dict(activation="swiglu", bias=False),
                    normalization=dict(kind="rmsnorm", first=False, final=True, post_sublayer=True))
    return ModelConfig(vocab_size=64, d_model=32, num_layers=4, max_len=48, **(sections | overrides))


def test_projection_rmsnorm_normalises_every_head_of_a_token_at_once():
    norm = ProjectionRMSNorm(4, 8, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 4, 5, 8)  # (B, H, T, D)
    flat = x.transpose(1, 2).reshape(2, 5, 32)  # (B, T, H·D)
    want = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    assert torch.allclose(norm(x), want.view(2, 5, 4, 8).transpose(1, 2), atol=1e-6)


def test_the_post_sublayer_block_adds_each_normalised_sublayer_to_the_stream():
    model = qkv.GPT(olmo_like()).eval()
    block = model.blocks[0]
    assert isinstance(block, PostSublayerTransformerBlock)
    x = torch.randn(2, 6, 32)
    h = x + block.attn_norm(block.attn(x, is_causal=True))  # x + Norm(Attn(x))
    want = h + block.ff_norm(block.ff(h))  # h + Norm(FFN(h))
    assert torch.allclose(block(x, is_causal=True).hidden, want, atol=1e-6)


def test_nope_layers_have_no_rope_and_cached_decoding_equals_uncached():
    model = qkv.GPT(olmo_like()).eval()
    assert [b.attn.rope is None for b in model.blocks] == [False, True, False, True]
    attn = model.blocks[0].attn
    assert isinstance(attn.q_norm, ProjectionRMSNorm) and attn.k_norm.weight.shape == (16,)  # G·D = 2·8
    ids = torch.randint(0, 64, (1, 5))
    assert torch.equal(model.generate(ids, 12, temperature=0), model.generate(ids, 12, temperature=0, use_cache=False))
    assert ModelConfig.from_dict(model.config.to_dict()) == model.config


@pytest.mark.parametrize("change, message", [
    (dict(position=dict(kind="rope", nope_layers=[4])), r"nope_layers=\(4,\) names layers outside 0 … 3"),
    (dict(position=dict(kind="learned", nope_layers=[1])), "nope_layers must list layer indices"),
    (dict(attention=dict(num_heads=4, qk_norm_scope="projection")), "'projection' with qk_norm=True"),
    (dict(attention=dict(num_heads=4, qk_norm=True, qk_norm_scope="heads")), "qk_norm_scope must be one of"),
    (dict(normalization=dict(kind="layernorm", first=False, post_sublayer=True)), "'projection' is an RMSNorm"),
    (dict(normalization=dict(kind="rmsnorm", first=True, post_sublayer=True)), "post_sublayer needs sequential post"),
])
def test_bad_configs_are_refused_naming_what_was_given(change, message):
    with pytest.raises(ValueError, match=message):
        olmo_like(**change)


def test_a_projection_norm_of_another_width_is_refused():
    with pytest.raises(ValueError, match=r"k_norm must normalise all 1 × 8 dims of its projection .* over \(16,\)"):
        MultiHeadAttention(16, 2, num_kv_heads=1, k_norm=ProjectionRMSNorm(2, 8))
