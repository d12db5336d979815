"""T5's bucketed relative position bias (Raffel et al. 2020 §2.1) against Hugging Face's T5Attention, and
position.kind "t5" in the models, the factory, the CLI and the PE study."""
import re

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.models import ModelConfig
from qkv.nn import MultiHeadAttention
from qkv.nn.relative_bias import T5RelativePositionBias, relative_position_bucket

modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason="the hf extra: pip install -e '.[hf]'")
SIZES = [(32, 128), (8, 16), (16, 20), (6, 7), (4, 3)]  # (num_buckets, max_distance)


def t5_config(**position) -> ModelConfig:
    return ModelConfig(vocab_size=40, d_model=32, attention=dict(num_heads=4), num_layers=2, max_len=64,
                       position={"kind": "t5", "num_buckets": 8, "max_distance": 20, **position})


def hf_attention(module: T5RelativePositionBias) -> torch.nn.Module:
    """A T5Attention holding a relative bias with ``module``'s sizes, direction and weights."""
    from transformers import T5Config
    cfg = T5Config(d_model=8, d_kv=2, num_heads=module.num_heads, is_decoder=not module.bidirectional,
                   relative_attention_num_buckets=module.num_buckets,
                   relative_attention_max_distance=module.max_distance)
    hf = modeling_t5.T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    hf.relative_attention_bias.weight.data.copy_(module.relative_attention_bias.weight.data)
    return hf


@pytest.mark.parametrize("num_buckets,max_distance", SIZES)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_bucket_equals_hugging_faces(num_buckets, max_distance, bidirectional):
    r = torch.arange(-300, 301)[None, :] + torch.arange(0, 3)[:, None]  # (3, 601): both signs, past max_distance
    ours = relative_position_bucket(r, bidirectional, num_buckets, max_distance)
    theirs = modeling_t5.T5Attention._relative_position_bucket(r, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert int(ours.min()) == 0 and int(ours.max()) == num_buckets - 1  # every bucket range reached, none past it


def test_bucket_formula_by_hand():
    """32 buckets, 128: one-sided distances 0 … 15 exact, then log-spaced, 128 on in bucket 31; the future is 0."""
    r = torch.tensor([0, -1, -15, -16, -127, -128, -1000, 5])
    assert relative_position_bucket(r, False).tolist() == [0, 1, 15, 16, 31, 31, 31, 0]
    # bidirectional: 16 a side, 8 exact; keys after the query (r > 0) in 16 … 31
    r = torch.tensor([0, -7, -8, 7, 8, 1000])
    assert relative_position_bucket(r, True).tolist() == [0, 7, 8, 16 + 7, 16 + 8, 31]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_bias_equals_hugging_faces_compute_bias(bidirectional, num_buckets, max_distance):
    torch.manual_seed(0)
    ours = T5RelativePositionBias(3, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    torch.nn.init.normal_(ours.relative_attention_bias.weight)
    hf = hf_attention(ours)
    with torch.no_grad():
        full = ours(40, 40)  # (1, H, L, S)
        assert full.shape == (1, 3, 40, 40)
        torch.testing.assert_close(full, hf.compute_bias(40, 40), rtol=0, atol=0)
        # new queries after 37 cached keys: bottom-right rows = HF's past_seen_tokens
        torch.testing.assert_close(ours(3, 40), hf.compute_bias(3, 40, past_seen_tokens=37), rtol=0, atol=0)
        torch.testing.assert_close(ours(3, 40, positions=torch.arange(10, 13)),
                                   hf.compute_bias(3, 40, past_seen_tokens=10), rtol=0, atol=0)


def test_gpt_is_one_sided_and_shares_one_table():
    model = qkv.GPT(t5_config())
    tables = {id(b.attn.relative_bias) for b in model.blocks}
    assert len(tables) == 1 and model.blocks[0].attn.relative_bias.bidirectional is False
    assert model.blocks[0].attn.relative_bias.num_buckets == 8  # position.num_buckets reached the module
    names = [n for n, _ in model.named_parameters() if "relative_bias" in n]
    assert names == ["blocks.0.attn.relative_bias.relative_attention_bias.weight"]  # one parameter, trained once


def test_cached_decoding_equals_uncached():
    torch.manual_seed(0)
    model = qkv.GPT(t5_config(max_distance=12)).eval()  # distances past 12 share a bucket: sequence of 30
    torch.nn.init.normal_(model.blocks[0].attn.relative_bias.relative_attention_bias.weight)
    ids = torch.randint(0, 40, (2, 30))
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V)
        caches = model.new_kv_caches(2, 30)
        steps = [model(ids[:, :9], kv_caches=caches).logits]
        steps += [model(ids[:, t:t + 1], kv_caches=caches).logits for t in range(9, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    prompt = ids[:, :5]
    assert torch.equal(model.generate(prompt, 12, top_k=1, use_cache=True),
                       model.generate(prompt, 12, top_k=1, use_cache=False))


def test_the_bias_moves_the_scores():
    """Position enters through the table: with it zeroed a prefix-permuted input changes nothing at the last
    query of an order-blind model; with the table set it does."""
    torch.manual_seed(0)
    enc = qkv.Encoder(t5_config()).eval()
    ids = torch.randint(0, 40, (1, 12))
    swapped = ids[:, torch.tensor([1, 0, *range(2, 12)])]
    table = enc.blocks[0].attn.relative_bias.relative_attention_bias.weight
    with torch.no_grad():
        table.zero_()
        blind = (enc(ids).last_hidden_state[:, 5] - enc(swapped).last_hidden_state[:, 5]).abs().max()
        torch.nn.init.normal_(table)
        seeing = (enc(ids).last_hidden_state[:, 5] - enc(swapped).last_hidden_state[:, 5]).abs().max()
    assert blind < 1e-5 and seeing > 1e-3


def test_encoder_uses_the_bidirectional_form():
    torch.manual_seed(0)
    enc = qkv.Encoder(t5_config())
    bias = enc.blocks[0].attn.relative_bias
    assert bias.bidirectional is True and all(b.attn.relative_bias is bias for b in enc.blocks)
    torch.nn.init.normal_(bias.relative_attention_bias.weight)
    with torch.no_grad():
        torch.testing.assert_close(bias(16, 16), hf_attention(bias).compute_bias(16, 16), rtol=0, atol=0)
        enc = qkv.Encoder(t5_config().replace(num_layers=1))  # one layer: a row sees only its own scores
        bias = enc.blocks[0].attn.relative_bias
        ids = torch.randint(0, 40, (1, 10))
        before = enc(ids).last_hidden_state
        bias.relative_attention_bias.weight[4:] += 1.0  # only keys after their query fall in buckets 4 … 7
        after = enc(ids).last_hidden_state
    assert (after[:, :-1] - before[:, :-1]).abs().max() > 1e-3  # rows with keys after them moved
    torch.testing.assert_close(after[:, -1], before[:, -1])  # the last query has no key after it: unchanged


def test_encoder_decoder_has_a_bidirectional_encoder_and_a_one_sided_decoder():
    model = qkv.Transformer(t5_config())
    enc, dec = model.encoder.blocks[0].attn.relative_bias, model.blocks[0].attn.relative_bias
    assert enc.bidirectional and not dec.bidirectional and enc is not dec
    assert model.blocks[0].cross_attn.relative_bias is None  # T5's cross-attention has no position bias


def test_fused_decode_step_refuses_t5():
    from qkv.kernels.fused_step import refuses as fused_refuses
    reason = fused_refuses(qkv.GPT(t5_config()), 1)
    assert reason is not None and "t5" in reason


@pytest.mark.parametrize("position,message", [
    (dict(kind="t5", num_buckets=0), r"position.num_buckets must be a positive int"),
    (dict(kind="t5", num_buckets=3), r"num_buckets must be >= 4 .* got 3"),
    (dict(kind="t5", num_buckets=32, max_distance=16), r"max_distance must be > num_buckets // 2 = 16, got 16"),
    (dict(kind="t5", max_distance=-1), r"position.max_distance must be a positive int"),
    (dict(kind="rope", num_buckets=16), r"num_buckets and max_distance are T5's: they need positional 't5'"),
])
def test_bad_config_one_clear_error_each(position, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(d_model=32, attention=dict(num_heads=4), position=position)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match=r"max_distance must be > max_exact = 4 .* got 4"):
        T5RelativePositionBias(2, bidirectional=False, num_buckets=8, max_distance=4)
    with pytest.raises(ValueError, match=r"num_buckets must be >= 4 \(bidirectional.*got 2"):
        T5RelativePositionBias(2, bidirectional=True, num_buckets=2, max_distance=8)
    with pytest.raises(TypeError, match="integer tensor"):
        relative_position_bucket(torch.zeros(3), True)
    bias = T5RelativePositionBias(2, bidirectional=False)
    with pytest.raises(ValueError, match=r"positions must be an integer tensor \(L=3,\), got"):
        bias(3, 5, positions=torch.arange(4))
    with pytest.raises(ValueError, match="relative_bias.num_heads must equal num_heads = 4, got 2"):
        MultiHeadAttention(32, 4, relative_bias=bias)
    with pytest.raises(ValueError, match="not both"):
        MultiHeadAttention(32, 2, alibi=qkv.ALiBi(2), relative_bias=bias)
    with pytest.raises(ValueError, match="sliding_attention layers with T5's relative bias are not supported"):
        ModelConfig(d_model=32, max_len=16, position=dict(kind="t5"), attention=dict(sliding_window=4, num_heads=4))


def test_cli_trains_t5_and_samples_from_the_run(data, tmp_path, capsys):
    out = tmp_path / "r"
    fast = ["--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-interval", "2", "--quiet",
            "--device", "cpu"]
    assert main(["train", *fast, "--data", str(data), "--max-steps", "2", "--out", str(out), "--sample-tokens", "0",
                 "--positional", "t5"]) == 0
    assert any('"kind": "t5"' in p.read_text() for p in out.glob("*.json"))
    assert main(["sample", "--run", str(out), "--prompt", "def f", "--max-new-tokens", "5", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["train", *fast, "--data", str(data), "--max-steps", "2", "--out", str(tmp_path / "bad"),
                 "--model", "position.kind=t5", "--model", "position.max_distance=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"max_distance must be > num_buckets // 2 = 16, got 8", err[0]), err
    assert not (tmp_path / "bad").exists()


def test_pe_study_has_t5_as_a_scheme():
    from qkv.studies import pe
    assert "t5" in pe.SCHEMES
    config = pe.PEStudyConfig().model_config("t5", 50)
    assert config.position.kind == "t5" and qkv.GPT(config).blocks[0].attn.relative_bias is not None
